package transfer

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/rdma/rdmatest"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

func smallTransferBench(t *testing.T) *transferBench {
	t.Helper()
	b := &transferBench{Seconds: 0.05, Rounds: 1, BatchBytes: 16 << 10, PoolBytes: 64 << 10}
	b.RDMA.GIDIndex = -1
	if err := b.parse("tcp,rdma", "read,write", "4KiB,16KiB", "1,2"); err != nil {
		t.Fatal(err)
	}
	if err := b.parseVerify("inline"); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestTransferMatrixVerifyModes: --verify inline,behind measures every TCP
// READ cell both ways, each moving verified pages, and refuses other modes.
func TestTransferMatrixVerifyModes(t *testing.T) {
	b := smallTransferBench(t)
	b.Transports, b.Ops = []string{"tcp"}, []string{"read"}
	if err := b.parseVerify("inline,behind"); err != nil {
		t.Fatal(err)
	}
	out := runMatrix(t, b)
	modes := map[string]int{}
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) >= 8 && f[0] == "tcp" {
			if f[len(f)-1] == "0" {
				t.Errorf("row verified no pages: %q", l)
			}
			modes[f[4]]++
		}
	}
	if modes["inline"] != 4 || modes["behind"] != 4 {
		t.Fatalf("rows per verify mode %v, want 4 each:\n%s", modes, out.String())
	}
	if err := b.parseVerify("later"); err == nil {
		t.Error("--verify later accepted")
	}
}

// runMatrix runs b's client side against its pages served on loopback
// and returns what it printed.
func runMatrix(t *testing.T, b *transferBench) *bytes.Buffer {
	t.Helper()
	addr := serveTransfer(t, b.pages(true))
	var out bytes.Buffer
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := b.client(ctx, &out, addr); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	return &out
}

// serveTransfer serves src on loopback until the test ends.
func serveTransfer(t *testing.T, src tcp.Source) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := tcp.NewServer(src, nil)
	done := make(chan error, 1)
	go func() { done <- srv.Serve(lis) }()
	t.Cleanup(func() {
		srv.Close()
		if err := <-done; !errors.Is(err, tcp.ErrServerClosed) {
			t.Errorf("serve: %v", err)
		}
	})
	return lis.Addr().String()
}

// TestTransferMatrixRuns runs the whole matrix over loopback with tiny
// cells (not a measurement): every TCP READ cell moves verified pages, the
// TCP WRITE cells and, on a machine without RDMA, the rdma cells are
// printed as skipped with the reason.
func TestTransferMatrixRuns(t *testing.T) {
	b := smallTransferBench(t)
	out := runMatrix(t, b)
	rows := 0
	for _, l := range strings.Split(out.String(), "\n") {
		f := strings.Fields(l)
		if len(f) > 0 && (f[0] == "tcp" || f[0] == "rdma") {
			rows++
		}
		if len(f) >= 9 && f[0] == "tcp" && f[1] == "READ" && f[len(f)-1] == "0" {
			t.Errorf("READ row verified no pages: %q", l)
		}
	}
	if rows != 2*2*2*2 {
		t.Fatalf("%d matrix rows, want 16:\n%s", rows, out.String())
	}
	err := b.rdmaOpenError()
	if err != nil && !errors.Is(err, rdma.ErrNoDevice) {
		t.Fatalf("rdma: %v, want an error wrapping rdma.ErrNoDevice", err)
	}
	if err != nil && !strings.Contains(out.String(), "rdma skipped: "+b.rdmaSkipReason()) {
		t.Fatalf("rdma rows not skipped with the reason:\n%s", out.String())
	}
}

// lyingSource serves pages whose bytes and header checksum agree with each
// other but not with the page's true contents: the TCP client's own check
// passes, the bench's must not.
type lyingSource struct{ p *transferPages }

func (s lyingSource) Open(ctx context.Context, wants []tcp.Want) ([]tcp.Page, func()) {
	pages, done := s.p.Open(ctx, wants)
	for i := range pages {
		if pages[i].Data != nil {
			bad := bytes.Clone(pages[i].Data)
			bad[0]++
			pages[i].Data, pages[i].Header.Checksum = bad, page.Checksum(bad)
		}
	}
	return pages, done
}

func TestTransferMatrixRefusesWrongBytes(t *testing.T) {
	b := smallTransferBench(t)
	b.Transports, b.Ops = []string{"tcp"}, []string{"read"}
	addr := serveTransfer(t, lyingSource{b.pages(true)})
	var out bytes.Buffer
	err := b.client(context.Background(), &out, addr)
	if err == nil || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("bench over wrong bytes: %v, want a checksum error\n%s", err, out.String())
	}
}

func TestTransferMatrixFlags(t *testing.T) {
	for _, bad := range [][4]string{
		{"udp", "read", "4KiB", "1"}, {"tcp", "copy", "4KiB", "1"},
		{"tcp", "read", "0", "1"}, {"tcp", "read", "4KiB", "0"}, {"tcp", "read", "", "1"},
	} {
		var b transferBench
		b.Rounds, b.Seconds = 1, 1
		if err := b.parse(bad[0], bad[1], bad[2], bad[3]); err == nil {
			t.Errorf("parse(%q) accepted", bad)
		}
	}
	if got := withoutFlag([]string{"--rps", "--sizes", "1MiB", "-rps=true"}, "rps"); strings.Join(got, " ") != "--sizes 1MiB" {
		t.Errorf("withoutFlag rps: %q", got)
	}
	if got := withoutFlag([]string{"--split-cpus", "--netns", "--sizes", "1MiB", "-netns=true"}, "netns"); strings.Join(got, " ") != "--split-cpus --sizes 1MiB" {
		t.Errorf("withoutFlag = %q", got)
	}
}

// TestTransferMatrixRDMARowsOverStandIn runs the rdma rows through the real
// binding against rdma's stand-in libibverbs (rdma/testdata), in a child
// process (a process holds one libibverbs): every row moves and verifies
// pages. The stand-in copies with memcpy, so its rates mean nothing. Needs
// cc and libibverbs-dev (rdmatest.OverStandIn: skips without;
// ORBITKV_REQUIRE=verbs-headers fails).
func TestTransferMatrixRDMARowsOverStandIn(t *testing.T) {
	rdmatest.OverStandIn(t, rdmaRowsOverStandIn)
}

func rdmaRowsOverStandIn(t *testing.T) {
	b := smallTransferBench(t)
	b.Transports = []string{"rdma"}
	var out bytes.Buffer
	if err := b.client(context.Background(), &out, ""); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log(out.String())
	rows := 0
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 0 && f[0] == "rdma" {
			rows++
			if strings.Contains(l, "skipped") || f[len(f)-1] == "0" {
				t.Errorf("rdma row moved nothing: %q", l)
			}
		}
	}
	if rows == 0 {
		t.Fatalf("no rdma row in the matrix:\n%s", out.String())
	}
}

// TestSplitCPUsHalvesAndWrapsInTaskset: --split-cpus gives namespace A the
// first half of the allowed CPUs and B the rest, each side's commands run
// under taskset; without it they run as they are.
func TestSplitCPUsHalvesAndWrapsInTaskset(t *testing.T) {
	for _, tc := range []struct {
		cpus []int
		want [2]string
	}{
		{[]int{0, 1}, [2]string{"0", "1"}},
		{[]int{0, 1, 2}, [2]string{"0", "1,2"}},
		{[]int{2, 3, 6, 7}, [2]string{"2,3", "6,7"}},
	} {
		got, err := halveCPUs(tc.cpus)
		if err != nil || got != tc.want {
			t.Errorf("halveCPUs(%v) = %q, %v; want %q", tc.cpus, got, err, tc.want)
		}
	}
	if _, err := halveCPUs([]int{0}); err == nil {
		t.Error("halveCPUs of one CPU accepted")
	}
	h := &netnsPair{ns: [2]string{"na", "nb"}}
	if got := strings.Join(h.exec(1, "iperf3", "-s").Args, " "); got != "ip netns exec nb iperf3 -s" {
		t.Errorf("shared: %q", got)
	}
	h.cpus = [2]string{"0", "1"}
	if got := strings.Join(h.exec(1, "iperf3", "-s").Args, " "); got != "taskset -c 1 ip netns exec nb iperf3 -s" {
		t.Errorf("split: %q", got)
	}
}

// TestTransferMatrixWritesCPUProfiles runs each side through the command's
// flags with --cpuprofile (one side at a time: a process holds one CPU
// profile): each writes a gzipped pprof file of its own.
func TestTransferMatrixWritesCPUProfiles(t *testing.T) {
	dir := t.TempDir()
	small := []string{"--sizes", "4KiB", "--conns", "1", "--transports", "tcp", "--ops", "read",
		"--seconds", "0.05", "--rounds", "1", "--batch-bytes", "16KiB", "--pool-bytes", "64KiB"}
	prof := append([]string{"--cpuprofile", dir + "/p"}, small...)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, side := range []string{"serve", "client"} {
		srvArgs, clArgs := small, prof
		if side == "serve" {
			srvArgs, clArgs = prof, small
		}
		// The ports are free when picked but taken again by their server a
		// moment later: another package's socket may get one in between
		// ("address already in use", 2026-12-06). Such a start is retried on
		// new ports; any other end of the serve side fails the test.
		for attempt := 1; !runProfiledSide(t, ctx, srvArgs, clArgs); attempt++ {
			if attempt == 5 {
				t.Fatalf("%s: the serve side found its ports taken in 5 tries", side)
			}
		}
		b, err := os.ReadFile(dir + "/p." + side + ".pprof")
		if err != nil {
			t.Fatal(err)
		}
		if len(b) < 2 || b[0] != 0x1f || b[1] != 0x8b {
			t.Errorf("%s profile: %d bytes, not gzip (pprof)", side, len(b))
		}
	}
}

// runProfiledSide serves srvArgs on two free ports (the fetch's, and the
// streams' one above it), runs clArgs against them until a client run
// completes, and stops the server; false when the serve side could not bind
// its ports (picked free, taken since), so the caller tries new ones.
func runProfiledSide(t *testing.T, ctx context.Context, srvArgs, clArgs []string) bool {
	t.Helper()
	addr := freePortPair(t)
	srvCtx, stopSrv := context.WithCancel(ctx)
	defer stopSrv()
	served := make(chan error, 1)
	go func() { served <- runArgs(srvCtx, append([]string{"--serve", addr}, srvArgs...), io.Discard) }()
	var out bytes.Buffer
	for err := errors.New("not yet"); err != nil; {
		select {
		case err := <-served:
			if err != nil && strings.Contains(err.Error(), "address already in use") {
				t.Logf("serve side: %v; trying other ports", err)
				return false
			}
			t.Fatalf("serve side ended: %v", err)
		default:
		}
		if ctx.Err() != nil {
			t.Fatalf("client: %v\n%s", err, out.String())
		}
		out.Reset()
		if err = runArgs(ctx, append([]string{"--client", addr}, clArgs...), &out); err != nil && !strings.Contains(err.Error(), "connection refused") {
			t.Fatalf("client: %v\n%s", err, out.String())
		}
	}
	stopSrv()
	if err := <-served; err != nil {
		t.Fatalf("serve: %v", err)
	}
	return true
}

// freePortPair returns 127.0.0.1:P where P and P+1 were both free just now.
func freePortPair(t *testing.T) string {
	t.Helper()
	for i := 0; i < 20; i++ {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		addr := lis.Addr().(*net.TCPAddr)
		next, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(addr.Port+1)))
		lis.Close()
		if err == nil {
			next.Close()
			return addr.String()
		}
	}
	t.Fatal("no two adjacent free ports on 127.0.0.1 in 20 tries")
	return ""
}

// A child whose output holds a line too long for startReady's scanner ends
// the scan without the ready line: startReady must say so and stop the
// child, not leave it running behind a pipe nobody reads.
func TestStartReadyStopsAChildWhoseLineIsTooLong(t *testing.T) {
	cmd := exec.Command("sh", "-c", `head -c 70000 /dev/zero | tr '\0' x; echo; echo serving; exec sleep 30`)
	c, err := startReady(context.Background(), cmd, "serving")
	if err == nil {
		c.stop()
		t.Fatal("ready, though the ready line came after a line too long to read")
	}
	if !strings.Contains(err.Error(), "before it was ready") {
		t.Fatalf("error %q", err)
	}
	if cmd.ProcessState == nil {
		cmd.Process.Kill()
		t.Fatal("the child still runs after startReady gave up on it")
	}
}

// TestCPUMaskIsSysfsHex: CPU lists become the hex words rps_cpus takes,
// the most significant word first; bad lists are refused.
func TestCPUMaskIsSysfsHex(t *testing.T) {
	for _, tc := range []struct{ list, want string }{
		{"0", "00000001"},
		{"0,1,5", "00000023"},
		{"8,9,10,11,12,13,14,15", "0000ff00"},
		{"0,33", "00000002,00000001"},
		{"32", "00000001,00000000"},
		{"1,64", "00000001,00000000,00000002"},
	} {
		cpus, err := parseCPUList(tc.list)
		if err != nil {
			t.Errorf("parseCPUList(%q): %v", tc.list, err)
			continue
		}
		if got := cpuMask(cpus); got != tc.want {
			t.Errorf("cpuMask(%q) = %q, want %q", tc.list, got, tc.want)
		}
	}
	for _, bad := range []string{"", "x", "-1", "0,,1", "2048", "0-3"} {
		if _, err := parseCPUList(bad); err == nil {
			t.Errorf("parseCPUList(%q) accepted", bad)
		}
	}
}

// TestNetnsFlagsNeedNetns: --split-cpus and --rps without --netns, and
// --rps without --split-cpus, are refused rather than ignored.
func TestNetnsFlagsNeedNetns(t *testing.T) {
	for _, tc := range []struct {
		netns, split, rps, ok bool
	}{
		{false, false, false, true},
		{true, false, false, true},
		{true, true, false, true},
		{true, true, true, true},
		{false, true, false, false},
		{false, false, true, false},
		{true, false, true, false},
	} {
		if err := checkNetnsFlags(tc.netns, tc.split, tc.rps); (err == nil) != tc.ok {
			t.Errorf("--netns=%v --split-cpus=%v --rps=%v: %v", tc.netns, tc.split, tc.rps, err)
		}
	}
	var out bytes.Buffer
	if err := runArgs(context.Background(), []string{"--client", "127.0.0.1:1", "--rps"}, &out); err == nil || !strings.Contains(err.Error(), "--netns") {
		t.Errorf("--client with --rps: %v", err)
	}
}

// TestSteerReceivesSetsEachVeth: --rps writes each namespace's CPUs into its
// veth's rps_cpus, read back from the namespace's own sysfs (root; the
// namespaces are removed at the end).
func TestSteerReceivesSetsEachVeth(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	if _, err := exec.LookPath("ip"); err != nil {
		t.Skip("no ip (iproute2): scripts/install-deps.sh installs it")
	}
	cpus, err := splitAllowedCPUs()
	if err != nil {
		t.Skip(err)
	}
	h, err := newNetnsPair(fmt.Sprintf("okv-rps-%d", os.Getpid()), "10.78.9")
	if err != nil {
		t.Fatal(err)
	}
	defer h.remove()
	h.cpus = cpus
	if err := h.steerReceives(); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		list, _ := parseCPUList(cpus[i])
		want := cpuMask(list)
		b, err := exec.Command("ip", "netns", "exec", h.ns[i], "cat", fmt.Sprintf("/sys/class/net/%s/queues/rx-0/rps_cpus", h.link[i])).Output()
		if err != nil {
			t.Fatal(err)
		}
		// sysfs prints as many hex digits as the machine has CPUs for.
		if got := strings.TrimSpace(string(b)); maskValue(t, got).Cmp(maskValue(t, want)) != 0 {
			t.Errorf("namespace %d (CPUs %s): rps_cpus %q, want %s", i, cpus[i], got, want)
		}
		if h.rps[i] != strings.TrimSpace(string(b)) {
			t.Errorf("namespace %d: steerReceives reported %q, the file reads %q", i, h.rps[i], b)
		}
	}
	h.cpus = [2]string{}
	if err := h.steerReceives(); err == nil {
		t.Error("steerReceives without CPU lists (no --split-cpus) accepted")
	}
}

// maskValue reads a sysfs CPU mask (hex words separated by commas).
func maskValue(t *testing.T, s string) *big.Int {
	v, ok := new(big.Int).SetString(strings.ReplaceAll(s, ",", ""), 16)
	if !ok {
		t.Fatalf("not a CPU mask: %q", s)
	}
	return v
}

// runArgs is `orbitkv bench transfer ARGS` as cmd/orbitkv wires it.
func runArgs(ctx context.Context, args []string, out io.Writer) error {
	cfg := DefaultConfig()
	fs := flag.NewFlagSet("bench transfer", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.Args = args
	return Run(ctx, cfg, out)
}
