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

// The CPU a process spends shows in /proc/PID/stat and in getrusage alike.
func TestProcCPUCountsWhatTheProcessSpends(t *testing.T) {
	before, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	self := selfCPU()
	x := 0
	for end := time.Now().Add(300 * time.Millisecond); time.Now().Before(end); {
		x++
	}
	after, err := procCPU(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if d := after - before; d < 100*time.Millisecond {
		t.Errorf("/proc stat counted %v over a 300-ms busy loop (%d turns)", d, x)
	}
	if d := selfCPU() - self; d < 100*time.Millisecond {
		t.Errorf("getrusage counted %v over a 300-ms busy loop", d)
	}
	if _, err := procCPU(1 << 30); err == nil {
		t.Error("a process that does not exist: no error")
	}
}

func TestIperf3ParseReadsRateAndCPU(t *testing.T) {
	out := []byte(`{"end":{"sum_received":{"bits_per_second":3.2e10},"cpu_utilization_percent":{"host_total":61.5,"remote_total":48.25}}}`)
	r, err := iperf3Parse(out, nil)
	if err != nil || r.gbps != 32 || r.clientCores != 0.615 || r.serverCores != 0.4825 {
		t.Fatalf("got %+v, %v", r, err)
	}
	if _, err := iperf3Parse([]byte("connect failed"), errors.New("exit status 1")); err == nil {
		t.Error("a failed iperf3: no error")
	}
	if _, err := iperf3Parse([]byte("not json"), nil); err == nil {
		t.Error("output that is not JSON: no error")
	}
}

func TestServedPIDFromTheReadyLine(t *testing.T) {
	for line, want := range map[string]int{
		"serving 96 pages on 10.79.1.1:7949 (pid 4242)": 4242,
		"serving 96 pages on 10.79.1.1:7949":            0,
		"serving 96 pages on x (pid )":                  0,
		"serving 96 pages on x (pid -3)":                0,
	} {
		if got, ok := servedPID(line); got != want || ok != (want > 0) {
			t.Errorf("%q: %d, %v; want %d", line, got, ok, want)
		}
	}
}

func TestCPUUseAndItsCost(t *testing.T) {
	var u cpuUse
	if u.cores() != 0 || coreCost(u.cores(), 3) != "?" {
		t.Fatal("nothing timed must read as unknown")
	}
	u.add(1500*time.Millisecond, time.Second)
	u.add(500*time.Millisecond, time.Second)
	if u.cores() != 1 || coreCost(u.cores(), 4) != "1.00 cores (0.250 s/GB)" {
		t.Fatalf("cores %v, cost %q", u.cores(), coreCost(u.cores(), 4))
	}
}
