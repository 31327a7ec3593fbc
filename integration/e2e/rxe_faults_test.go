package e2e

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// The faults of TestTwoGuestsOverRealVerbs, after its clean load: the links
// of host-a (the holder) go down while host-b READs its pages and come
// back; then host-a's peer is SIGKILLed while host-b READs. host-b drives;
// host-a's half of the test serves a small control API on the link
// (guestControl) that triggers each fault at the moment a placement lease
// is held, that is, while host-b's RDMA READ of the placed pages is in
// flight, and reports its own counters.

// guestControl is host-a's control port.
const guestControl = ":7960"

// holderControl is host-a's side: its peer, and the errors its handlers
// found (reported by the test's goroutine, not theirs).
type holderControl struct {
	p    *proc
	devs []string           // the netdevs under rxe0 and rxe1
	page func(i int) []byte // the bytes of the i-th page host-a saved
	done chan struct{}

	mu struct {
		sync.Mutex
		errs []string
		logs []string
	}
}

func (h *holderControl) logf(format string, args ...any) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.logs = append(h.mu.logs, time.Now().Format("15:04:05.000 ")+fmt.Sprintf(format, args...))
}

func (h *holderControl) errorf(format string, args ...any) {
	h.logf("ERROR "+format, args...)
	h.mu.Lock()
	defer h.mu.Unlock()
	h.mu.errs = append(h.mu.errs, fmt.Sprintf(format, args...))
}

// serveControl runs host-a's control API until host-b says /done (or
// within): /clean (leases released, nothing served over TCP), /fault
// (kind=link: the links down for down, then up; kind=kill: SIGKILL the
// peer; each once host-b's READ is under way), /corrupt (a byte of page
// ?page= flipped in the peer's DRAM), /leases (none held, within 30 s),
// /counters.
func serveControl(t *testing.T, p *proc, page func(int) []byte, within time.Duration) {
	h := &holderControl{p: p, devs: []string{"eth0", "eth1"}, page: page, done: make(chan struct{})}
	mux := http.NewServeMux()
	mux.HandleFunc("/clean", h.clean)
	mux.HandleFunc("/fault", h.fault)
	mux.HandleFunc("/corrupt", h.corrupt)
	mux.HandleFunc("/leases", h.leases)
	mux.HandleFunc("/counters", h.counters)
	var once sync.Once
	mux.HandleFunc("/done", func(w http.ResponseWriter, _ *http.Request) {
		once.Do(func() { close(h.done) })
	})
	ln, err := net.Listen("tcp", guestAddr[0]+guestControl)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln)
	// Shutdown, not Close: /done closes h.done inside its handler, and a Close
	// could drop that request's connection before its answer, so host-b's GET
	// was retried on a fresh connection and refused (fresh clone, 2026-12-06).
	defer func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			srv.Close()
		}
	}()
	select {
	case <-h.done:
	case <-time.After(within):
		t.Errorf("host-b did not finish within %v", within)
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, l := range h.mu.logs {
		t.Log("host-a: " + l)
	}
	for _, e := range h.mu.errs {
		t.Error("host-a: " + e)
	}
}

func (h *holderControl) clean(w http.ResponseWriter, _ *http.Request) {
	released, served := h.waitValue(`orbitkv_cluster_placement_leases_total{end="released"}`, 10*time.Second, func(v float64) bool { return v >= 1 }), h.value("orbitkv_cluster_served_pages_total")
	h.logf("clean load: placement leases released %v; pages served over TCP %v", released, served)
	if released < 1 || served != 0 {
		h.errorf("clean load: %v leases released (want ≥ 1), %v pages served over TCP (want 0)", released, served)
		http.Error(w, "leases or TCP", http.StatusConflict)
	}
}

func (h *holderControl) fault(w http.ResponseWriter, r *http.Request) {
	kind := r.URL.Query().Get("kind")
	down, _ := time.ParseDuration(r.URL.Query().Get("down"))
	if kind != "link" && kind != "kill" {
		http.Error(w, "kind: link or kill", http.StatusBadRequest)
		return
	}
	w.WriteHeader(http.StatusAccepted)
	go func() {
		if err := h.waitREAD(20 * time.Second); err != nil {
			h.errorf("%s: %v", kind, err)
			return
		}
		if kind == "kill" {
			h.logf("kill: host-b's READ is under way: SIGKILL the peer")
			h.p.kill()
			h.logf("kill: the peer is gone")
			return
		}
		h.logf("link: host-b's READ is under way: %v down for %v", h.devs, down)
		h.setLinks("down")
		time.Sleep(down) // the outage itself, not a wait for a condition
		h.setLinks("up")
		h.logf("link: %v up", h.devs)
	}()
}

// setLinks sets every netdev under host-a's rxe devices down or up, by
// ioctl (SIOCSIFFLAGS, as `ip link set` does): no process to start, so the
// outage lands while host-b's READ is still under way.
func (h *holderControl) setLinks(state string) {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		h.errorf("links %s: socket: %v", state, err)
		return
	}
	defer unix.Close(fd)
	for _, dev := range h.devs {
		if err := setLink(fd, dev, state == "up"); err != nil {
			h.errorf("link %s %s: %v", dev, state, err)
		}
	}
}

func setLink(fd int, dev string, up bool) error {
	ifr, err := unix.NewIfreq(dev)
	if err != nil {
		return err
	}
	if err := unix.IoctlIfreq(fd, unix.SIOCGIFFLAGS, ifr); err != nil {
		return err
	}
	flags := ifr.Uint16() &^ unix.IFF_UP
	if up {
		flags |= unix.IFF_UP
	}
	ifr.SetUint16(flags)
	return unix.IoctlIfreq(fd, unix.SIOCSIFFLAGS, ifr)
}

// rxeSentPackets is an rxe device's count of packets sent: on host-a,
// which never READs, RDMA READ responses (the exchange and placements go
// over TCP).
func rxeSentPackets(dev string) string {
	return "/sys/class/infiniband/" + dev + "/ports/1/hw_counters/sent_pkts"
}

// waitREAD returns once host-b's RDMA READ of placed pages is under way:
// rxe0 or rxe1 has sent a packet since the fault was asked for, which only
// READ responses are (of the 2048 each 2 MiB a fetch places at once takes
// at the 1024-byte path MTU). The counters are read every 100 µs: rxe
// queues a READ's responses faster than the link carries them, so a link
// down or a kill must land at once to meet the READ (a trigger at 32
// packets, read every millisecond, let one striped READ be sent whole
// first in two runs of five; one on the lease, a metrics scrape away, was
// later still).
func (h *holderControl) waitREAD(within time.Duration) error {
	sent := func() (uint64, error) {
		var total uint64
		for _, dev := range guestRXE {
			n, err := readCounter(rxeSentPackets(dev))
			if err != nil {
				return 0, fmt.Errorf("%s's sent packets: %w", dev, err)
			}
			total += n
		}
		return total, nil
	}
	base, err := sent()
	if err != nil {
		return err
	}
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		if n, err := sent(); err == nil && n > base {
			return nil
		}
	}
	return fmt.Errorf("no RDMA READ of host-a's pages seen under way within %v", within)
}

func readCounter(path string) (uint64, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	var n uint64
	_, err = fmt.Sscan(string(b), &n)
	return n, err
}

func (h *holderControl) leases(w http.ResponseWriter, _ *http.Request) {
	held := h.waitValue("orbitkv_cluster_placement_leases_held", 30*time.Second, func(v float64) bool { return v == 0 })
	ends := map[string]float64{}
	for _, e := range []string{"released", "expired", "closed"} {
		ends[e] = h.value(`orbitkv_cluster_placement_leases_total{end="` + e + `"}`)
	}
	h.logf("leases held %v; ended %v", held, ends)
	if held != 0 {
		h.errorf("%v placement leases still held 30 s after the fault", held)
		http.Error(w, "leases held", http.StatusConflict)
		return
	}
	fmt.Fprintf(w, "held 0, ended %v", ends)
}

func (h *holderControl) counters(w http.ResponseWriter, _ *http.Request) {
	fmt.Fprintf(w, "served %v released %v", h.value("orbitkv_cluster_served_pages_total"),
		h.value(`orbitkv_cluster_placement_leases_total{end="released"}`))
}

// value is one series of the peer's metrics (-1 when unreadable).
func (h *holderControl) value(series string) float64 {
	v, err := seriesAt(h.p.metrics, series)
	if err != nil {
		return -1
	}
	return v
}

// waitValue polls series until ok or within passes, and returns its last
// value.
func (h *holderControl) waitValue(series string, within time.Duration, ok func(float64) bool) float64 {
	deadline := time.Now().Add(within)
	for {
		v := h.value(series)
		if ok(v) || time.Now().After(deadline) {
			return v
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// seriesAt reads one series from a peer's /metrics (no testing.T: the
// control handlers call it).
func seriesAt(addr, series string) (float64, error) {
	c := http.Client{Timeout: 5 * time.Second}
	resp, err := c.Get("http://" + addr + "/metrics")
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == series {
			var v float64
			_, err := fmt.Sscan(f[1], &v)
			return v, err
		}
	}
	return 0, fmt.Errorf("no series %s", series)
}

// control asks host-a's control API; a refusal fails the test.
func control(t *testing.T, path string) string {
	t.Helper()
	c := http.Client{Timeout: 60 * time.Second}
	resp, err := c.Get("http://" + guestAddr[0] + guestControl + path)
	if err != nil {
		t.Fatalf("host-a's control %s: %v", path, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode >= 300 {
		t.Fatalf("host-a's control %s: %s %s", path, resp.Status, body)
	}
	return strings.TrimSpace(string(body))
}

// loader is host-b's side of the faults: its peer and engine, the pages'
// keys, where it loads them and the bytes they must have.
type loader struct {
	p     *proc
	e     *engineProc
	shm   *engineclient.Shm
	admin pb.AdminServiceClient
	keys  [][]byte
	dst   []*pb.PageRef
	want  [][]byte
}

func newLoader(t *testing.T, p *proc, e *engineProc, shm *engineclient.Shm, keys [][]byte, dst []*pb.PageRef, want [][]byte) *loader {
	t.Helper()
	conn, err := engineclient.Dial(p.socket)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	return &loader{p: p, e: e, shm: shm, admin: pb.NewAdminServiceClient(conn), keys: keys, dst: dst, want: want}
}

// outcome is what one load of the pages gave.
type outcome struct {
	ok, failed, wrong int
	took              time.Duration // logged only: a load is judged by how it ended
	err               string        // the call's error, or the first page's failure
	callErr           error         // the call's error (nil: the peer answered)
	codes             []pb.PageCode // each page's (none when the call failed)
}

// load drops the pages from this peer (DRAM, then SSD: the next load must
// fetch them from host-a), zeroes their destination, loads them within d
// and checks every page answered OK.
func (l *loader) load(t *testing.T, d time.Duration) outcome {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	for _, tier := range []pb.Tier{pb.Tier_TIER_DRAM, pb.Tier_TIER_SSD} {
		if _, err := l.admin.Evict(ctx, &pb.EvictRequest{Tier: tier, Keys: l.keys}); err != nil {
			t.Fatalf("evict from %v: %v", tier, err)
		}
	}
	cancel()
	for _, r := range l.dst {
		zeroPage(l.shm, r.Blocks)
	}
	ctx, cancel = context.WithTimeout(context.Background(), d)
	defer cancel()
	start := time.Now()
	st, err := l.e.Load(ctx, l.dst)
	o := outcome{took: time.Since(start)}
	if err != nil {
		o.err, o.failed, o.callErr = err.Error(), len(l.dst), err
		return o
	}
	for i, pg := range st.Pages {
		o.codes = append(o.codes, pg.Code)
		switch {
		case pg.Code != pb.PageCode_PAGE_OK:
			o.failed++
			if o.err == "" {
				o.err = fmt.Sprintf("page %d: %s %s", i, pg.Code, pg.Message)
			}
		case !bytes.Equal(l.want[i], pageBytesAs(l.shm, l.dst[i].Blocks, guestFlash)):
			o.wrong++
		default:
			o.ok++
		}
	}
	return o
}

func zeroPage(shm *engineclient.Shm, blocks []uint32) {
	for layer := 0; layer < guestFlash.Layers; layer++ {
		for pl := 0; pl < 2; pl++ {
			for _, b := range blocks {
				off := guestFlash.BlockOffset(layer, pl, int(b))
				clear(shm.Mem[off : off+guestFlash.BlockBytes()])
			}
		}
	}
}

// loadsDuring loads the pages again and again for span (12 loads at most:
// a load that fails at once takes milliseconds), each load within d, and
// checks each one: it ended by its deadline and no page answered OK holds a
// wrong byte. The client enforces the deadline d itself, so a load that
// returns did not outlast it (a hang is the test's own timeout); its end is
// the peer's answer, every page ended (OK or failed, none pending), or that
// deadline, nothing else.
func (l *loader) loadsDuring(t *testing.T, what string, span, d time.Duration) []outcome {
	t.Helper()
	var out []outcome
	for end := time.Now().Add(span); time.Now().Before(end) && len(out) < 12; {
		o := l.load(t, d)
		out = append(out, o)
		t.Logf("%s: load %d: %d ok, %d failed, %d wrong in %v %s", what, len(out), o.ok, o.failed, o.wrong, o.took.Round(time.Millisecond), o.err)
		if o.wrong != 0 {
			t.Errorf("%s: load %d: %d pages answered OK with wrong bytes", what, len(out), o.wrong)
		}
		switch {
		case o.callErr != nil && status.Code(o.callErr) != codes.DeadlineExceeded && !errors.Is(o.callErr, context.DeadlineExceeded):
			t.Errorf("%s: load %d failed with %v: want the peer's answer or its deadline %v", what, len(out), o.callErr, d)
		case o.callErr == nil && (len(o.codes) != len(l.dst) || slices.Contains(o.codes, pb.PageCode_PAGE_PENDING)):
			t.Errorf("%s: load %d answered %v for %d pages: want every page ended", what, len(out), o.codes, len(l.dst))
		}
	}
	return out
}

// linkDownMidRead: host-a's links go down for 6 s while host-b READs its
// placed pages, then come back (rxe retransmits a READ through a 2 s
// outage and completes it: 6 s outlasts each load's 4 s deadline). Every
// load ends by its deadline, 0 wrong bytes; the outage hit a READ (one
// failed or timed out) or, when rxe had sent the READ under way whole
// before the links went down, cut the load between its fetches (the next
// placement, over TCP, met the outage); host-a holds no lease
// afterwards; once the links are back the lanes are up again (the engine
// reconnected it, or the cluster dialed a fresh connection after the lane
// went down), host-a shows as rdma, and a load moves every page by RDMA
// READ again (none over TCP, host-a serving nothing over TCP).
func (l *loader) linkDownMidRead(t *testing.T) {
	before := l.rdmaCounters(t)
	control(t, "/fault?kind=link&down=6s")
	out := l.loadsDuring(t, "link down", 10*time.Second, 4*time.Second)
	during := l.rdmaCounters(t)
	t.Logf("host-b's rdma counters: before %v, after the outage's loads %v", before, during)
	readHit := during["failed ops"] != before["failed ops"] || during["timeouts"] != before["timeouts"]
	if !readHit && !cutLoad(out[0]) {
		t.Fatalf("no RDMA READ failed or timed out, and the first load did not end part loaded: the outage hit no fetch")
	}
	t.Logf("the outage hit a READ: %v (else the first load between its fetches)", readHit)
	t.Logf("host-a after the outage: %s", control(t, "/leases"))
	start := time.Now()
	waitFor(t, "host-a over rdma again in host-b's peers", 90*time.Second, func() bool {
		out, err := l.p.cli(t, "peers")
		return err == nil && transportIs(out, hostName(0), "rdma")
	})
	t.Logf("host-a over rdma %v after the outage's loads", time.Since(start).Round(time.Millisecond))
	l.allByRDMA(t, "after the link came back")
	t.Logf("host-b's rdma counters at the end: %v", l.rdmaCounters(t))
}

// allByRDMA loads the pages (dropped here first) and checks that every one
// arrived right, by RDMA READ: the engine read their bytes, no page went
// over TCP, host-a's TCP data plane served nothing.
func (l *loader) allByRDMA(t *testing.T, what string) {
	t.Helper()
	hostA := control(t, "/counters")
	overTCP := l.series(t, "orbitkv_cluster_rdma_fallback_pages_total")
	read := l.series(t, "orbitkv_rdma_read_bytes_total")
	var o outcome
	// The first READ on a lane the engine left broken reconnects it; a
	// lane reconnected too often in a row stays down until the cluster
	// redials: a few loads at most.
	for try := 0; try < 5; try++ {
		if o = l.load(t, 20*time.Second); o.ok == len(l.keys) || o.wrong != 0 {
			break
		}
		t.Logf("%s: try %d: %d ok, %d failed %s", what, try, o.ok, o.failed, o.err)
		waitFor(t, "host-a over rdma", 90*time.Second, func() bool {
			out, err := l.p.cli(t, "peers")
			return err == nil && transportIs(out, hostName(0), "rdma")
		})
		overTCP, read = l.series(t, "orbitkv_cluster_rdma_fallback_pages_total"), l.series(t, "orbitkv_rdma_read_bytes_total")
		hostA = control(t, "/counters")
	}
	hostAAfter := control(t, "/counters")
	readNow, overTCPNow := l.series(t, "orbitkv_rdma_read_bytes_total"), l.series(t, "orbitkv_cluster_rdma_fallback_pages_total")
	t.Logf("%s: %d ok, %d failed, %d wrong in %v %s; read by rdma %v bytes; pages over TCP %v → %v; host-a %s → %s",
		what, o.ok, o.failed, o.wrong, o.took.Round(time.Millisecond), o.err, readNow-read, overTCP, overTCPNow, hostA, hostAAfter)
	want := float64(len(l.keys) * len(l.want[0]))
	if o.ok != len(l.keys) || o.wrong != 0 || readNow-read < want || overTCPNow != overTCP || servedOf(hostAAfter) != servedOf(hostA) {
		t.Fatalf("%s: want all %d pages right by RDMA READ (%v bytes read), none over TCP", what, len(l.keys), want)
	}
}

// rdmaCounters is host-b's engine counters (orbitkv_rdma_*) and its lane
// fallbacks, for the log and the checks.
func (l *loader) rdmaCounters(t *testing.T) map[string]float64 {
	t.Helper()
	out := map[string]float64{}
	for k, series := range map[string]string{
		"failed ops": "orbitkv_rdma_failed_ops_total", "error completions": "orbitkv_rdma_error_completions_total",
		"timeouts": "orbitkv_rdma_timeouts_total", "reconnects": "orbitkv_rdma_reconnects_total",
		"lane fallbacks": "orbitkv_cluster_transport_fallbacks_total",
	} {
		out[k] = l.series(t, series)
	}
	return out
}

// holderKilledMidRead: host-a's peer is SIGKILLed while host-b READs its
// placed pages. Every load ends by its deadline with an error or the right
// bytes (0 wrong); host-a's leases died with its process. The kill lands
// inside a fetch: the READ under way fails (its QP went with the process:
// an RDMA op failed or timed out) or, when rxe had already sent every
// response of that READ before the process died (it completes, byte-exact;
// with two lanes a 2 MiB READ is often all sent within the 80 ms a kill
// takes under TCG), the same load's next placement fails.
func (l *loader) holderKilledMidRead(t *testing.T) {
	before := l.rdmaCounters(t)
	control(t, "/fault?kind=kill")
	out := l.loadsDuring(t, "holder killed", 5*time.Second, 4*time.Second)
	after := l.rdmaCounters(t)
	t.Logf("host-b's rdma counters: before %v, after %v", before, after)
	failed := 0
	for _, o := range out {
		failed += o.failed
	}
	if failed == 0 {
		t.Fatalf("no load failed in %d loads after host-a's peer was killed", len(out))
	}
	readHit := after["failed ops"] != before["failed ops"] || after["timeouts"] != before["timeouts"]
	if !readHit && !cutLoad(out[0]) {
		t.Fatalf("no RDMA READ failed or timed out, and the first load did not end part loaded: the kill hit no fetch")
	}
	t.Logf("the kill hit the READ under way: %v (else the load's next placement)", readHit)
}

// cutLoad says whether a load both moved pages and had pages fail other
// than as not found (the page the corrupt case dropped): the fault landed
// between its fetches.
func cutLoad(o outcome) bool {
	failed := 0
	for _, c := range o.codes {
		if c != pb.PageCode_PAGE_OK && c != pb.PageCode_PAGE_NOT_FOUND {
			failed++
		}
	}
	return o.ok > 0 && failed > 0
}

// series is one series of host-b's metrics.
func (l *loader) series(t *testing.T, name string) float64 {
	t.Helper()
	v, _ := scrapeSeries(t, l.p, name)
	return v
}

// servedOf is the served count of a /counters answer.
func servedOf(counters string) string {
	f := strings.Fields(counters)
	if len(f) < 2 {
		return counters
	}
	return f[1]
}
