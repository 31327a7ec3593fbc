package main

import (
	"errors"
	"os"
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
