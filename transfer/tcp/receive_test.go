package tcp

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"runtime"
	"sync"
	"testing"
	"testing/iotest"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// TestReadPageInPieces: readPage hands over the page's bytes in order, in
// pieces of at most recvChunk, whatever the reads return, and the checksum
// continued over the pieces is the whole page's.
func TestReadPageInPieces(t *testing.T) {
	readers := map[string]func(io.Reader) io.Reader{
		"whole reads": func(r io.Reader) io.Reader { return r },
		"half reads":  iotest.HalfReader,
		"data and EOF together": func(r io.Reader) io.Reader {
			return iotest.DataErrReader(r)
		},
	}
	for _, size := range []int{1, 4097, recvChunk - 1, recvChunk, recvChunk + 1, 3*recvChunk + 5} {
		data := pattern(size)
		for name, wrap := range readers {
			dst := make([]byte, size)
			var crc uint32
			var joined []byte
			err := readPage(wrap(bytes.NewReader(data)), dst, func(b []byte) {
				if len(b) > recvChunk {
					t.Errorf("%s, %d bytes: a piece of %d bytes", name, size, len(b))
				}
				crc = page.UpdateChecksum(crc, b)
				joined = append(joined, b...)
			})
			switch {
			case err != nil:
				t.Errorf("%s, %d bytes: %v", name, size, err)
			case !bytes.Equal(dst, data) || !bytes.Equal(joined, data):
				t.Errorf("%s, %d bytes: bytes differ", name, size)
			case crc != page.Checksum(data):
				t.Errorf("%s, %d bytes: pieces sum to %08x, page %08x", name, size, crc, page.Checksum(data))
			}
		}
	}
}

func TestReadPageShortStream(t *testing.T) {
	data := pattern(recvChunk + 10)
	err := readPage(bytes.NewReader(data[:recvChunk+3]), make([]byte, len(data)), nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatalf("a stream that ends inside the page: %v, want unexpected EOF", err)
	}
}

// TestChangedPieceIsCaught: a page served with one byte changed in its
// first, a middle or its last piece (the header keeping the true
// checksum) fails alone as corrupt; its neighbours in the answer arrive.
// Every way of checking: on the reading goroutine, behind it, and auto
// (alone, so inline); and both ways of sending: in one go, and piece by
// piece read ahead (Server.PrefetchBytes).
func TestChangedPieceIsCaught(t *testing.T) {
	size := 3*recvChunk + 100
	for _, v := range []Verify{VerifyInline, VerifyBehind, VerifyAuto} {
		for _, prefetch := range []int{0, DefaultPrefetchBytes} {
			for name, at := range map[string]int{"first byte": 0, "middle piece": recvChunk + recvChunk/2, "last byte": size - 1} {
				t.Run(fmt.Sprintf("%s, %s, prefetch %d", name, v, prefetch), func(t *testing.T) { changedPieceIsCaught(t, size, at, v, prefetch) })
			}
		}
	}
}

func changedPieceIsCaught(t *testing.T, size, at int, v Verify, prefetch int) {
	src := newMemSource()
	a, bad, c3 := src.add(1, size), src.add(2, size), src.add(3, 5000)
	src.flip[bad.Key] = at
	_, addr := serve(t, src, nil, func(s *Server) { s.PrefetchBytes = prefetch })
	c := NewClient(nil)
	c.Verify = v
	defer c.Close()
	ask := []Want{a, bad, c3}
	dst := buffers(ask)
	errs := errsOf(c.Fetch(ctxFor(t, 10*time.Second), addr, ask, dst))
	var ce *page.CorruptError
	if !errors.As(errs[1], &ce) || ce.Key != bad.Key {
		t.Fatalf("changed page: %v, want a CorruptError for it", errs[1])
	}
	if errs[0] != nil || errs[2] != nil || !bytes.Equal(dst[0], src.pages[a.Key].Data) || !bytes.Equal(dst[2], src.pages[c3.Key].Data) {
		t.Fatalf("neighbours of the changed page: %v, %v", errs[0], errs[2])
	}
	if got := c.ReceivedBytes(); got != a.Size+c3.Size {
		t.Errorf("received %d verified bytes, want %d", got, a.Size+c3.Size)
	}
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*131 + i>>9)
	}
	return b
}

// TestAnAnswerCutInsideAPageFailsIt: a server that goes away in the middle
// of a page's bytes fails that page with the connection's error, not as
// corrupt and not as a hang, whichever goroutine checks the bytes.
func TestAnAnswerCutInsideAPageFailsIt(t *testing.T) {
	data := pattern(3 * recvChunk)
	h := page.Header{Key: pagekey.Key{5}, Layout: layout, Length: uint64(len(data)), Checksum: page.Checksum(data), Generation: 1}
	for _, behind := range []bool{false, true} {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		go func() {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			defer c.Close()
			if _, err := io.ReadFull(c, make([]byte, reqHeadSize+wantSize)); err != nil {
				return
			}
			head := make([]byte, 1+page.WireSize)
			head[0] = statusOK
			h.EncodeWire(head[1:])
			c.Write(append(head, data[:recvChunk+5]...))
		}()
		c := NewClient(nil)
		if behind {
			c.Verify = VerifyBehind
		}
		w := Want{Key: h.Key, Layout: layout, Size: h.Length}
		errs := errsOf(c.Fetch(ctxFor(t, 5*time.Second), lis.Addr().String(), []Want{w}, buffers([]Want{w})))
		var ce *page.CorruptError
		if errs[0] == nil || errors.As(errs[0], &ce) || errors.Is(errs[0], context.DeadlineExceeded) {
			t.Errorf("behind %v: a page cut short: %v, want the connection's error", behind, errs[0])
		}
		if c.ReceivedBytes() != 0 {
			t.Errorf("behind %v: %d bytes counted as received", behind, c.ReceivedBytes())
		}
		c.Close()
		lis.Close()
	}
}

// A prefetched answer's pieces carry the answer's bytes in order, each
// piece pieceBytes of page bytes but the last, small pages sharing a piece
// and large ones cut; each piece names the page bytes it holds.
func TestPiecesCutPagesAndKeepTheOrder(t *testing.T) {
	big := bytes.Repeat([]byte{7}, 2*pieceBytes+5)
	small := []byte{1, 2, 3}
	bufs := net.Buffers{{0xa}, {0xb, 0xc}, big, {0xd}, {0xe}, small, {0xf}}
	data := []int{2, 5}
	for k := range 100 { // 100 pages of 10 KiB: four pieces
		bufs = append(bufs, []byte{0x10}, bytes.Repeat([]byte{byte(k)}, 10<<10))
		data = append(data, len(bufs)-1)
	}
	ps := pieces(bufs, data)
	var want, got []byte
	for _, b := range bufs {
		want = append(want, b...)
	}
	var perPiece []int
	for _, p := range ps {
		n, d := 0, 0
		for _, b := range p.bufs {
			got = append(got, b...)
			if d < len(p.data) && len(b) > 0 && &b[0] == &p.data[d][0] && len(b) == len(p.data[d]) {
				n += len(b)
				d++
			}
		}
		if d != len(p.data) {
			t.Fatalf("a piece names page bytes it does not write")
		}
		perPiece = append(perPiece, n)
	}
	if !bytes.Equal(got, want) {
		t.Fatal("the pieces' bytes differ from the answer's")
	}
	total := 2*pieceBytes + 5 + 3 + 100*10<<10
	wantPer := []int{pieceBytes, pieceBytes, pieceBytes, pieceBytes, pieceBytes, total - 5*pieceBytes}
	if fmt.Sprint(perPiece) != fmt.Sprint(wantPer) {
		t.Fatalf("page bytes per piece %v, want %v", perPiece, wantPer)
	}
}

// A client that goes away mid-answer ends the read-ahead write: the
// request's pages are released and the server serves the next client.
func TestPrefetchedAnswerEndsWhenTheClientLeaves(t *testing.T) {
	src := newMemSource()
	w := src.add(1, 32<<20) // far more than the socket buffers take
	_, addr := serve(t, src, nil, func(s *Server) { s.PrefetchBytes = DefaultPrefetchBytes })
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := raw.Write(appendRequest(nil, 10*time.Second, []Want{w})); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(raw, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	raw.Close()
	deadline := time.Now().Add(5 * time.Second)
	for src.releases.Load() != 1 && time.Now().Before(deadline) {
		time.Sleep(time.Millisecond)
	}
	if o, r := src.opens.Load(), src.releases.Load(); o != 1 || r != 1 {
		t.Fatalf("opens %d releases %d after the client left, want 1 and 1", o, r)
	}
	c := NewClient(nil)
	defer c.Close()
	dst := buffers([]Want{w})
	if errs := errsOf(c.Fetch(ctxFor(t, 10*time.Second), addr, []Want{w}, dst)); errs[0] != nil {
		t.Fatalf("the next client: %v", errs[0])
	}
}

// The defaults spend a core per connection only where there are cores to
// spare: GOMAXPROCS 4 and more reads ahead and checksums behind the reads
// of fetches that run beside others (VerifyAuto), less does neither.
func TestDefaultsFollowTheCores(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		procs    int
		prefetch int
		verify   Verify
	}{{1, 0, VerifyInline}, {3, 0, VerifyInline}, {4, DefaultPrefetchBytes, VerifyAuto}, {16, DefaultPrefetchBytes, VerifyAuto}} {
		runtime.GOMAXPROCS(tc.procs)
		s, c := NewServer(nil, nil), NewClient(nil)
		if s.PrefetchBytes != tc.prefetch || c.Verify != tc.verify {
			t.Errorf("GOMAXPROCS %d: prefetch %d, verify %s; want %d, %s", tc.procs, s.PrefetchBytes, c.Verify, tc.prefetch, tc.verify)
		}
	}
}

// VerifyAuto checks behind the reads only a fetch that starts beside
// another; the fixed modes ignore how many run.
func TestVerifyAutoGoesBehindBesideAnotherFetch(t *testing.T) {
	for _, tc := range []struct {
		v        Verify
		inFlight int32
		behind   bool
	}{
		{VerifyInline, 1, false}, {VerifyInline, 3, false},
		{VerifyBehind, 1, true}, {VerifyBehind, 2, true},
		{VerifyAuto, 1, false}, {VerifyAuto, 2, true}, {VerifyAuto, 8, true},
	} {
		if got := tc.v.behind(tc.inFlight); got != tc.behind {
			t.Errorf("%s with %d fetches under way: behind %v, want %v", tc.v, tc.inFlight, got, tc.behind)
		}
	}
	for _, name := range []string{"inline", "behind", "auto"} {
		if v, err := ParseVerify(name); err != nil || v.String() != name {
			t.Errorf("ParseVerify(%q) = %v, %v", name, v, err)
		}
	}
	if _, err := ParseVerify("sideways"); err == nil {
		t.Error("ParseVerify(sideways): no error")
	}
}

// Fetches that overlap under VerifyAuto (so checked behind their reads)
// each get their own pages' bytes, and a changed page among them fails
// alone.
func TestOverlappingAutoFetchesGetTheirOwnBytes(t *testing.T) {
	src := newMemSource()
	var wants []Want
	for i := range 8 {
		wants = append(wants, src.add(uint64(i+1), 3*recvChunk+i*1000))
	}
	bad := wants[5]
	src.flip[bad.Key] = recvChunk + 7
	_, addr := serve(t, src, nil)
	c := NewClient(nil)
	c.Verify = VerifyAuto
	defer c.Close()
	release := make(chan struct{})
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			<-release
			for round := range 5 {
				ask := []Want{wants[g], wants[g+4]}
				dst := buffers(ask)
				errs := errsOf(c.Fetch(ctxFor(t, 10*time.Second), addr, ask, dst))
				for i, w := range ask {
					var ce *page.CorruptError
					switch {
					case w.Key == bad.Key:
						if !errors.As(errs[i], &ce) {
							t.Errorf("fetcher %d round %d: changed page: %v, want corrupt", g, round, errs[i])
						}
					case errs[i] != nil || !bytes.Equal(dst[i], src.pages[w.Key].Data):
						t.Errorf("fetcher %d round %d page %d: %v or bytes differ", g, round, i, errs[i])
					}
				}
			}
		})
	}
	close(release)
	wg.Wait()
	if n := c.inFlight.Load(); n != 0 {
		t.Errorf("%d fetches counted under way after all returned", n)
	}
	if c.checkedBehind.Load() == 0 {
		t.Error("no fetch checked behind its reads: the overlap was not tested")
	}
}
