package transfer

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"
)

// A command name may hold spaces and parentheses: the CPU times are counted
// after its last ')'.
func TestParseProcStatCPU(t *testing.T) {
	line := "4242 (orbit kv) (x)) S 1 4242 4242 0 -1 4194560 100 0 0 0 250 130 0 0 20 0 9 0 123 456 789\n"
	got, err := parseProcStatCPU(line)
	if err != nil || got != 3800*time.Millisecond {
		t.Fatalf("got %v, %v; want 3.8s (250 + 130 ticks)", got, err)
	}
	for _, bad := range []string{"4242 orbitkv S 1", "4242 (orbitkv) S 1 2 3", "1 (a) S 1 1 1 0 -1 0 0 0 0 0 x 5 0"} {
		if _, err := parseProcStatCPU(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
}

// The CPU a process spends shows in /proc/PID/stat as in getrusage.
func TestProcCPUAgreesWithGetrusage(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self := selfCPU()
	x := 0
	for deadline := time.Now().Add(10 * time.Second); selfCPU()-self < 200*time.Millisecond; x++ {
		if time.Now().After(deadline) {
			t.Fatalf("getrusage counted %v in 10 s of a busy loop", selfCPU()-self)
		}
	}
	spent := selfCPU() - self
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// /proc counts in 10-ms ticks; the two reads of each bracket the loop a
	// little apart.
	if d, slack := after-before, 20*time.Millisecond+spent/10; d < spent-slack || d > spent+slack {
		t.Errorf("/proc stat counted %v where getrusage counted %v (%d turns)", d, spent, x)
	}
	if _, err := procCPU(1 << 30); err == nil {
		t.Error("a process that does not exist: no error")
	}
}

func TestIperf3ParseReadsRateAndCPU(t *testing.T) {
	out := []byte(`{"end":{"sum_received":{"bits_per_second":3.2e10,"bytes":4e9,"seconds":1.0001},"cpu_utilization_percent":{"host_total":61.5,"remote_total":48.25}}}`)
	r, err := iperf3Parse(out, nil)
	if err != nil || r.gbps != 32 || r.clientCores != 0.615 || r.serverCores != 0.4825 || r.bytes != 4e9 || r.seconds != 1.0001 {
		t.Fatalf("got %+v, %v", r, err)
	}
	if _, err := iperf3Parse([]byte("connect failed"), errors.New("exit status 1")); err == nil {
		t.Error("a failed iperf3: no error")
	}
	if _, err := iperf3Parse([]byte("not json"), nil); err == nil {
		t.Error("output that is not JSON: no error")
	}
}

func TestCPUUseAndItsCost(t *testing.T) {
	var u cpuUse
	if u.cores() != 0 || u.perGB() != 0 || u.cost() != "?" {
		t.Fatal("nothing timed must read as unknown")
	}
	u.why = "no such process"
	if u.cost() != "? (no such process)" {
		t.Fatalf("unknown with a reason: %q", u.cost())
	}
	u = cpuUse{}
	u.add(1500*time.Millisecond, time.Second, 4e9)
	u.add(500*time.Millisecond, time.Second, 4e9)
	if u.cores() != 1 || u.cost() != "1.00 cores (0.250 s/GB)" {
		t.Fatalf("cores %v, cost %q", u.cores(), u.cost())
	}
	var b cpuUse
	b.add(time.Second, 2*time.Second, 8e9)
	if got := versus(u, b); got != " = 2.00× iperf3's" {
		t.Fatalf("versus: %q", got)
	}
	if versus(u, cpuUse{}) != "" {
		t.Fatal("a ratio to an unknown cost")
	}
}

// /proc/stat's per-CPU lines: busy is user, nice, system, irq and softirq;
// the total adds idle, iowait and steal; the all-CPU line is skipped.
func TestParsePerCPU(t *testing.T) {
	stat := "cpu  9 9 9 9 9 9 9 9 0 0\ncpu0 10 1 5 80 2 1 3 4 7 0\ncpu3 0 0 0 100 0 0 0 0 0 0\nintr 1 2 3\n"
	p, err := parsePerCPU(stat)
	if err != nil {
		t.Fatal(err)
	}
	if len(p) != 2 || p[0] != (cpuTicks{busy: 20, softirq: 3, steal: 4, total: 106}) || p[3] != (cpuTicks{total: 100}) {
		t.Fatalf("got %+v", p)
	}
	for _, bad := range []string{"intr 1\n", "cpuX 1 2 3 4 5 6 7 8\n", "cpu1 1 2 3 4 5 6 7 x\n"} {
		if _, err := parsePerCPU(bad); err == nil {
			t.Errorf("%q: no error", bad)
		}
	}
	if _, err := readPerCPU(); err != nil {
		t.Errorf("this machine's /proc/stat: %v", err)
	}
}

// The busiest CPUs come first, those under the floor are left out, and
// steal is over all CPUs.
func TestCPUSpanBusiest(t *testing.T) {
	s := cpuSpan{sum: perCPU{
		0: {busy: 30, softirq: 10, total: 100},
		1: {busy: 95, softirq: 50, steal: 5, total: 100},
		2: {busy: 5, total: 100},
	}}
	if got, want := s.busiest(10, 8), "1 95% (si 50%), 0 30% (si 10%); steal 1.7%"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got, want := s.busiest(10, 1), "1 95% (si 50%), +1 more; steal 1.7%"; got != want {
		t.Errorf("got %q, want %q", got, want)
	}
	if got := (cpuSpan{why: "no /proc"}).busiest(10, 8); got != "? (no /proc)" {
		t.Errorf("unknown: %q", got)
	}
	var live cpuSpan
	live.end(spanStart())
	if live.sum == nil || live.why != "" {
		t.Errorf("a span over this machine: %+v", live)
	}
}

// --verify default is the mode the client picks itself (auto from 4
// cores on, else inline), named as such in the table; the header names the
// serve side's read-ahead as its default picks it, and its send buffers.
func TestVerifyDefaultAndReadAheadFollowTheCores(t *testing.T) {
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(0))
	for _, tc := range []struct {
		procs       int
		modes, want string
		header      string
	}{
		{2, "default", "[inline]", "serve side writing answers in one go (its default"},
		{2, "default,inline,behind", "[inline behind]", "serve side writing answers in one go (its default"},
		{8, "default", "[auto]", "serve side reading 2MiB ahead of its writes (its default"},
		{8, "default,behind,auto", "[auto behind]", "serve side reading 2MiB ahead of its writes (its default"},
	} {
		runtime.GOMAXPROCS(tc.procs)
		b := transferBench{PrefetchBytes: -1}
		if err := b.parseVerify(tc.modes); err != nil || fmt.Sprint(b.Verify) != tc.want {
			t.Errorf("GOMAXPROCS %d, --verify %s: %v, %v; want %s", tc.procs, tc.modes, b.Verify, err, tc.want)
		}
		if h := b.experiments(); !strings.Contains(h, tc.header) {
			t.Errorf("GOMAXPROCS %d: header %q, want %q", tc.procs, h, tc.header)
		}
	}
	b := transferBench{PrefetchBytes: 0, SendBuffer: -1}
	if h := b.experiments(); h != ", serve side writing answers in one go, send buffers of 512KiB asked for" {
		t.Errorf("--serve-prefetch 0: header %q", h)
	}
	b.Splice, b.SendBuffer = true, 0
	if h := b.experiments(); h != ", serve side splicing page bytes into the socket, send buffers autotuned" {
		t.Errorf("--serve-splice --serve-sndbuf 0: header %q", h)
	}
	if err := b.parseVerify("sideways"); err == nil {
		t.Error("--verify sideways: no error")
	}
}
