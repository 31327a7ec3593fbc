package transfer

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
)

// Which CPUs a TCP cell keeps busy, and in what: the processes' own CPU
// time (cpu.go) cannot show a CPU that is full while its
// process's total looks light, nor time spent in softirq (on veth the
// receiver's TCP processing runs there, on the sender's CPU) or stolen by
// the hypervisor. So each cell also reads the machine's per-CPU times
// (/proc/stat) around its measured rounds and around each iperf3
// variant's, and prints the busiest CPUs of each beside the other.

// cpuTicks is one CPU's times from /proc/stat, in USER_HZ ticks.
type cpuTicks struct {
	busy, softirq, steal, total uint64
}

// perCPU is every CPU's ticks, by CPU number.
type perCPU map[int]cpuTicks

// readPerCPU reads /proc/stat's per-CPU lines.
func readPerCPU() (perCPU, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, err
	}
	return parsePerCPU(string(b))
}

// parsePerCPU reads "cpuN user nice system idle iowait irq softirq steal
// …" lines; busy is user, nice, system, irq and softirq; total adds idle,
// iowait and steal. (guest time is already inside user.)
func parsePerCPU(s string) (perCPU, error) {
	out := perCPU{}
	for _, line := range strings.Split(s, "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		n, err := strconv.Atoi(f[0][3:])
		if err != nil {
			return nil, fmt.Errorf("/proc/stat: %q", f[0])
		}
		var v [8]uint64
		for i := range v {
			if v[i], err = strconv.ParseUint(f[1+i], 10, 64); err != nil {
				return nil, fmt.Errorf("/proc/stat: %s field %d: %q", f[0], i+1, f[1+i])
			}
		}
		user, nice, system, idle, iowait, irq, softirq, steal := v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]
		busy := user + nice + system + irq + softirq
		out[n] = cpuTicks{busy: busy, softirq: softirq, steal: steal, total: busy + idle + iowait + steal}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("/proc/stat: no per-CPU lines")
	}
	return out, nil
}

// cpuSpan sums per-CPU ticks over spans of time (a cell's rounds).
type cpuSpan struct {
	sum perCPU
	why string // why the times could not be read, if they could not
}

// spanStart is a span's first reading, nil if /proc/stat cannot be read.
func spanStart() perCPU {
	p, _ := readPerCPU()
	return p
}

// end adds the time since start to the span.
func (s *cpuSpan) end(start perCPU) {
	now, err := readPerCPU()
	if start == nil || err != nil {
		if err == nil {
			err = fmt.Errorf("/proc/stat not read at the start")
		}
		s.why = err.Error()
		return
	}
	if s.sum == nil {
		s.sum = perCPU{}
	}
	for n, a := range now {
		b, ok := start[n]
		if !ok || a.total < b.total {
			continue // a CPU that came online meanwhile
		}
		t := s.sum[n]
		t.busy += a.busy - b.busy
		t.softirq += a.softirq - b.softirq
		t.steal += a.steal - b.steal
		t.total += a.total - b.total
		s.sum[n] = t
	}
}

// busiest formats the CPUs at least minPct busy, busiest first (at most
// max of them), each as "N busy% (si softirq%)", and the steal over all
// CPUs; "?" with the reason when unknown.
func (s cpuSpan) busiest(minPct float64, max int) string {
	if s.sum == nil {
		if s.why != "" {
			return "? (" + s.why + ")"
		}
		return "?"
	}
	type one struct {
		n        int
		busy, si float64
	}
	var l []one
	var steal, total uint64
	for n, t := range s.sum {
		steal, total = steal+t.steal, total+t.total
		if t.total == 0 {
			continue
		}
		b := 100 * float64(t.busy) / float64(t.total)
		if b >= minPct {
			l = append(l, one{n, b, 100 * float64(t.softirq) / float64(t.total)})
		}
	}
	slices.SortFunc(l, func(a, b one) int {
		if a.busy != b.busy {
			if a.busy > b.busy {
				return -1
			}
			return 1
		}
		return a.n - b.n
	})
	parts := make([]string, 0, len(l))
	for i, c := range l {
		if i == max {
			parts = append(parts, fmt.Sprintf("+%d more", len(l)-max))
			break
		}
		parts = append(parts, fmt.Sprintf("%d %.0f%% (si %.0f%%)", c.n, c.busy, c.si))
	}
	if len(parts) == 0 {
		parts = append(parts, fmt.Sprintf("none ≥ %.0f%%", minPct))
	}
	st := 0.0
	if total > 0 {
		st = 100 * float64(steal) / float64(total)
	}
	return fmt.Sprintf("%s; steal %.1f%%", strings.Join(parts, ", "), st)
}
