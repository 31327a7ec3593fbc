package tcp

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/internal/pki"
)

// memSource serves pages from a map and counts opens and releases.
type memSource struct {
	mu       sync.Mutex
	pages    map[pagekey.Key]Page
	corrupt  map[pagekey.Key]bool // send the header with a wrong checksum
	flip     map[pagekey.Key]int  // send the bytes with this one changed (the header's checksum true)
	block    chan struct{}        // Open waits for it or the deadline
	hold     chan struct{}        // with block: Open, past the deadline, also waits for it
	opens    atomic.Int64
	releases atomic.Int64
}

func newMemSource() *memSource {
	return &memSource{pages: map[pagekey.Key]Page{}, corrupt: map[pagekey.Key]bool{}, flip: map[pagekey.Key]int{}}
}

var layout = pagekey.Fingerprint{1, 2, 3}

func (m *memSource) add(seed uint64, size int) Want {
	r := rand.New(rand.NewPCG(seed, 7))
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	var k pagekey.Key
	for i := range k {
		k[i] = byte(r.Uint32())
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pages[k] = Page{Header: page.Header{Key: k, Layout: layout, Length: uint64(size), Checksum: page.Checksum(data), Generation: seed}, Data: data}
	return Want{Key: k, Layout: layout, Size: uint64(size)}
}

func (m *memSource) Open(ctx context.Context, wants []Want) ([]Page, func()) {
	m.opens.Add(1)
	m.mu.Lock()
	block, hold := m.block, m.hold
	m.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			if hold != nil {
				<-hold
			}
		}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]Page, len(wants))
	for i, w := range wants {
		p, ok := m.pages[w.Key]
		if !ok {
			continue
		}
		if m.corrupt[w.Key] {
			p.Header.Checksum++
		}
		if at, ok := m.flip[w.Key]; ok {
			p.Data = bytes.Clone(p.Data)
			p.Data[at] ^= 0x01
		}
		out[i] = p
	}
	return out, func() { m.releases.Add(1) }
}

func serve(t testing.TB, src Source, cfg *tls.Config, opts ...func(*Server)) (*Server, string) {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := NewServer(src, cfg)
	for _, o := range opts {
		o(s)
	}
	done := make(chan error, 1)
	go func() { done <- s.Serve(lis) }()
	t.Cleanup(func() {
		s.Close()
		if err := <-done; !errors.Is(err, ErrServerClosed) {
			t.Errorf("Serve returned %v", err)
		}
	})
	return s, lis.Addr().String()
}

func buffers(wants []Want) [][]byte {
	dst := make([][]byte, len(wants))
	for i, w := range wants {
		dst[i] = make([]byte, w.Size)
	}
	return dst
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// The same answers whether the server writes an answer in one go or
// piece by piece with a goroutine reading ahead (PrefetchBytes: one byte,
// less than a piece, or the default).
func TestFetchPagesInOrderWithMissing(t *testing.T) {
	modes := map[string]func(*Server){
		"in one go":  func(s *Server) { s.PrefetchBytes = 0 },
		"prefetch 1": func(s *Server) { s.PrefetchBytes = 1 },
		"prefetch 2": func(s *Server) { s.PrefetchBytes = DefaultPrefetchBytes },
	}
	for name, mode := range modes {
		t.Run(name, func(t *testing.T) { testFetchPagesInOrderWithMissing(t, mode) })
	}
}

func testFetchPagesInOrderWithMissing(t *testing.T, mode func(*Server)) {
	src := newMemSource()
	var wants []Want
	for i := range 6 {
		wants = append(wants, src.add(uint64(i), 1000+i*4099))
	}
	wants = append(wants, src.add(6, 2*pieceBytes+4099)) // written in three pieces when prefetching
	missing := Want{Key: pagekey.Key{9}, Layout: layout, Size: 10}
	otherLayout := wants[1]
	otherLayout.Layout = pagekey.Fingerprint{7}
	ask := append(append([]Want{wants[0], missing, otherLayout}, wants[2:]...), missing)
	srv, addr := serve(t, src, nil, mode)
	c := NewClient(nil)
	defer c.Close()
	for round := range 2 { // the second round reuses the connection
		dst := buffers(ask)
		errs := errsOf(c.Fetch(ctxFor(t, 5*time.Second), addr, ask, dst))
		for i, w := range ask {
			switch {
			case i == 1 || i == 2 || i == len(ask)-1:
				if !errors.Is(errs[i], ErrNotFound) {
					t.Errorf("round %d page %d: %v, want not found", round, i, errs[i])
				}
			case errs[i] != nil:
				t.Errorf("round %d page %d: %v", round, i, errs[i])
			case !bytes.Equal(dst[i], src.pages[w.Key].Data):
				t.Errorf("round %d page %d: bytes differ", round, i)
			}
		}
	}
	st := srv.Stats()
	if st.Requests != 2 || st.Pages != 12 || st.Missing != 6 {
		t.Errorf("server stats %+v", st)
	}
	// The server releases a request's pages after its last write, which
	// may come after the client read the answer.
	deadline := time.Now().Add(5 * time.Second)
	for src.opens.Load() != src.releases.Load() && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if src.opens.Load() != src.releases.Load() {
		t.Errorf("opens %d releases %d", src.opens.Load(), src.releases.Load())
	}
	c.mu.Lock()
	idle := len(c.idle[addr])
	c.mu.Unlock()
	if idle != 1 {
		t.Errorf("%d idle connections after two sequential fetches, want 1 (reused)", idle)
	}
}

func TestCorruptPageFailsAloneAndConnectionSurvives(t *testing.T) {
	src := newMemSource()
	a, b, c3 := src.add(1, 5000), src.add(2, 6000), src.add(3, 7000)
	src.corrupt[b.Key] = true
	_, addr := serve(t, src, nil)
	c := NewClient(nil)
	defer c.Close()
	ask := []Want{a, b, c3}
	got := c.Fetch(ctxFor(t, 5*time.Second), addr, ask, buffers(ask))
	errs := errsOf(got)
	if got[0].Header.Checksum != src.pages[a.Key].Header.Checksum || got[0].Header.Generation != 1 {
		t.Errorf("header of page 0: %+v", got[0].Header)
	}
	var ce *page.CorruptError
	if errs[0] != nil || errs[2] != nil || !errors.As(errs[1], &ce) || ce.Key != b.Key {
		t.Fatalf("errs %v", errs)
	}
	if got := c.ReceivedBytes(); got != a.Size+c3.Size {
		t.Errorf("received %d verified bytes, want %d", got, a.Size+c3.Size)
	}
	if errs := errsOf(c.Fetch(ctxFor(t, 5*time.Second), addr, []Want{a}, buffers([]Want{a}))); errs[0] != nil {
		t.Errorf("fetch after a corrupt page: %v", errs[0])
	}
}

func TestFetchEndsAtItsDeadline(t *testing.T) {
	src := newMemSource()
	w := src.add(1, 100)
	src.block = make(chan struct{}) // never closed: Open waits for its deadline
	src.hold = make(chan struct{})  // and then for the fetch to have ended
	_, addr := serve(t, src, nil)
	c := NewClient(nil)
	defer c.Close()
	// The server answers only once the fetch returned: the fetch ends by its
	// own deadline (the error says which), not by the server, however late
	// a loaded machine fires either side's timers; the test's timeout catches
	// a hang. (Without hold, the server's deadline, a transit later than the
	// client's, once let the page through first under -race: CI, 2026-12-06.)
	errs := errsOf(c.Fetch(ctxFor(t, 200*time.Millisecond), addr, []Want{w}, buffers([]Want{w})))
	close(src.hold)
	if errs[0] == nil || !errors.Is(errs[0], context.DeadlineExceeded) {
		t.Errorf("err %v, want deadline exceeded", errs[0])
	}
	deadline := time.Now().Add(30 * time.Second) // a bound on the wait below, not a measure
	for src.releases.Load() != src.opens.Load() && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if src.releases.Load() != 1 {
		t.Errorf("server released %d of %d opens", src.releases.Load(), src.opens.Load())
	}
}

func TestBadInputIsRefusedBeforeTheNetwork(t *testing.T) {
	c := NewClient(nil)
	defer c.Close()
	w := Want{Key: pagekey.Key{1}, Size: 10}
	for name, dst := range map[string][][]byte{"short buffer": {make([]byte, 9)}, "no buffer": nil} {
		errs := errsOf(c.Fetch(context.Background(), "127.0.0.1:1", []Want{w}, dst))
		if errs[0] == nil || !strings.Contains(errs[0].Error(), "buffer") {
			t.Errorf("%s: %v", name, errs[0])
		}
	}
}

func TestServerRefusesMalformedRequests(t *testing.T) {
	src := newMemSource()
	srv, addr := serve(t, src, nil)
	var reported atomic.Int64
	srv.OnError = func(string, error) { reported.Add(1) }
	for name, req := range map[string][]byte{
		"bad magic":  []byte("HTTP/1.1 GET / xx"),
		"zero pages": appendRequest(nil, time.Second, nil),
		"zero size":  appendRequest(nil, time.Second, []Want{{Key: pagekey.Key{1}}}),
	} {
		conn, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		conn.SetDeadline(time.Now().Add(5 * time.Second))
		conn.Write(req)
		var b [1]byte
		if n, err := conn.Read(b[:]); n != 0 || err == nil {
			t.Errorf("%s: server answered %d bytes (%v); want the connection closed", name, n, err)
		}
		conn.Close()
	}
	if src.opens.Load() != 0 {
		t.Errorf("a malformed request reached the source %d times", src.opens.Load())
	}
}

func TestMutualTLS(t *testing.T) {
	ca, err := pki.NewCA("cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	other, _ := pki.NewCA("intruder", time.Hour)
	member, intruder := peerTLS(t, ca), peerTLS(t, other)
	src := newMemSource()
	w := src.add(1, 4096)
	_, addr := serve(t, src, member.Server)

	good := NewClient(member.Client)
	defer good.Close()
	dst := buffers([]Want{w})
	if errs := errsOf(good.Fetch(ctxFor(t, 5*time.Second), addr, []Want{w}, dst)); errs[0] != nil || !bytes.Equal(dst[0], src.pages[w.Key].Data) {
		t.Fatalf("member fetch: %v", errs[0])
	}
	noCert := member.Client.Clone()
	noCert.Certificates = nil
	for name, cfg := range map[string]*tls.Config{"other CA": intruder.Client, "no certificate": noCert, "plain TCP": nil} {
		c := NewClient(cfg)
		errs := errsOf(c.Fetch(ctxFor(t, 5*time.Second), addr, []Want{w}, buffers([]Want{w})))
		if errs[0] == nil {
			t.Errorf("%s: fetched a page from a mutual-TLS server", name)
		}
		c.Close()
	}
	if src.opens.Load() != 1 {
		t.Errorf("source opened %d times; only the member may reach it", src.opens.Load())
	}
	// A member client refuses a server of another cluster.
	_, rogue := serve(t, src, intruder.Server)
	if errs := errsOf(good.Fetch(ctxFor(t, 5*time.Second), rogue, []Want{w}, buffers([]Want{w}))); errs[0] == nil {
		t.Error("member fetched from a server of another CA")
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(appendRequest(nil, time.Second, []Want{{Key: pagekey.Key{1}, Size: 10}}))
	f.Add([]byte("OKVF\x01\x01\x00\x00\xff\xff\xff\xff\x00\x00\x00\x01"))
	f.Fuzz(func(t *testing.T, b []byte) {
		if len(b) < reqHeadSize {
			return
		}
		d, n, err := parseHead(b[:reqHeadSize])
		if err != nil {
			return
		}
		if d <= 0 || d > MaxDeadline || n <= 0 || n > MaxPages {
			t.Fatalf("accepted deadline %v pages %d", d, n)
		}
		body := b[reqHeadSize:]
		if len(body) < n*wantSize {
			return
		}
		if ws, err := parseWants(body, n); err == nil && len(ws) != n {
			t.Fatalf("%d wants for %d", len(ws), n)
		}
	})
}

// FuzzClientAnswer feeds arbitrary bytes to a client as a server's answer:
// it must fail cleanly, and report a page fetched only when its bytes match.
func FuzzClientAnswer(f *testing.F) {
	data := bytes.Repeat([]byte{7}, 64)
	h := page.Header{Key: pagekey.Key{1}, Layout: layout, Length: 64, Checksum: page.Checksum(data)}
	ok := make([]byte, 1+page.WireSize)
	h.EncodeWire(ok[1:])
	f.Add(append(ok, data...))
	f.Add([]byte{statusNotFound})
	f.Add([]byte{9})
	f.Fuzz(func(t *testing.T, answer []byte) {
		client, server := net.Pipe()
		go func() {
			defer server.Close()
			server.SetDeadline(time.Now().Add(2 * time.Second))
			head := make([]byte, reqHeadSize+wantSize)
			if _, err := io_ReadFull(server, head); err != nil {
				return
			}
			server.Write(answer)
		}()
		c := NewClient(nil)
		cn := &conn{Conn: client, r: bufioReader(client)}
		w := Want{Key: h.Key, Layout: layout, Size: 64}
		dst := [][]byte{make([]byte, 64)}
		errs := []error{nil}
		res := make([]Result, 1)
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		got, err := c.exchange(ctx, cn, []Want{w}, dst, res, errs, c.Verify.behind(1))
		client.Close()
		if err == nil && got == 1 && errs[0] == nil && !bytes.Equal(dst[0], data) {
			t.Fatalf("reported a fetched page whose bytes differ: %x", dst[0])
		}
	})
}

func io_ReadFull(c net.Conn, b []byte) (int, error) { return io.ReadFull(c, b) }

func bufioReader(c net.Conn) *bufio.Reader { return bufio.NewReader(c) }

func errsOf(res []Result) []error {
	errs := make([]error, len(res))
	for i, r := range res {
		errs[i] = r.Err
	}
	return errs
}

// peerTLS issues a peer certificate for 127.0.0.1 under ca and returns its
// mutual-TLS configs.
func peerTLS(t *testing.T, ca pki.Pair) pki.Configs {
	t.Helper()
	p, err := pki.Issue(ca, "peer", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	c, err := pki.New(p, ca.CertPEM)
	if err != nil {
		t.Fatal(err)
	}
	return c
}
