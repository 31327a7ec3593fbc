package transfer

import (
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/orbitkv/orbitkv/internal/bytesize"
	"golang.org/x/sys/unix"
)

// What a TCP cell costs in CPU, beside what iperf3 costs for its baseline:
// the cores each side keeps busy during the measured rounds and the
// core-seconds each spends per GB moved. Throughput alone cannot tell a
// side that runs out of core (busy ≈ one core a connection) from one that
// waits (docs/benchmarks.md, "On 16 cores": one fetch connection moved
// 58–70% of one iperf3 stream, and two connections 0.98–1.47× one where
// iperf3 nearly doubled). The client is the receiving side in both tools
// (iperf3 runs with -R) and the server the sending side: this binary's
// --serve process (--serve-pid; --netns passes it) and iperf3's server.
// Both tools' figures are a process's own CPU time. On veth the receiver's
// TCP processing runs in softirq on the sender's CPU, charged to the
// sending process when it runs at the end of its system call (or to no one
// where the kernel accounts interrupt time apart), and work left to
// ksoftirqd is charged to neither: the split between the sides is blurred
// alike for both tools, so compare a side with the same side.

// cpuUse sums CPU time, the wall time it was spent in and the bytes moved
// meanwhile; why, if set, is why the CPU time could not be read.
type cpuUse struct {
	cpu, wall time.Duration
	bytes     float64
	why       string
}

func (u *cpuUse) add(cpu, wall time.Duration, bytes float64) {
	u.cpu, u.wall, u.bytes = u.cpu+cpu, u.wall+wall, u.bytes+bytes
}

// cores is how many cores were busy on average; 0 when nothing was timed.
func (u cpuUse) cores() float64 {
	if u.wall <= 0 {
		return 0
	}
	return u.cpu.Seconds() / u.wall.Seconds()
}

// perGB is the core-seconds spent per GB moved; 0 when unknown.
func (u cpuUse) perGB() float64 {
	if u.bytes <= 0 || u.wall <= 0 {
		return 0
	}
	return u.cpu.Seconds() / (u.bytes / 1e9)
}

// cost formats cores busy and core-seconds per GB, "?" (with the reason,
// if known) when unknown.
func (u cpuUse) cost() string {
	if u.wall <= 0 || u.bytes <= 0 {
		if u.why != "" {
			return "? (" + u.why + ")"
		}
		return "?"
	}
	return fmt.Sprintf("%.2f cores (%.3f s/GB)", u.cores(), u.perGB())
}

// versus is a's cost per GB as a multiple of b's ("" when either is unknown).
func versus(a, b cpuUse) string {
	if a.perGB() <= 0 || b.perGB() <= 0 {
		return ""
	}
	return fmt.Sprintf(" = %.2f× iperf3's", a.perGB()/b.perGB())
}

// selfCPU is this process's CPU time so far (user and system; its children,
// the iperf3 clients, are not counted).
func selfCPU() time.Duration {
	var ru unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// userHZ is the unit of /proc/PID/stat's CPU times: Linux fixes USER_HZ at
// 100 for user space on every architecture it runs here (x86-64, arm64).
const userHZ = 100

// procCPU is the CPU time (user and system) of process pid so far, from
// /proc/PID/stat, in steps of 10 ms.
func procCPU(pid int) (time.Duration, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0, err
	}
	return parseProcStatCPU(string(b))
}

// parseProcStatCPU reads utime and stime (fields 14 and 15) from a
// /proc/PID/stat line. The command name (field 2) is in parentheses and may
// hold spaces and parentheses of its own, so fields are counted after its
// last ')'.
func parseProcStatCPU(s string) (time.Duration, error) {
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("/proc stat: no command name in %q", s)
	}
	f := strings.Fields(s[i+1:]) // f[0] is field 3 (state)
	if len(f) < 13 {
		return 0, fmt.Errorf("/proc stat: %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, x := range f[11:13] {
		n, err := strconv.ParseInt(x, 10, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("/proc stat: CPU time %q", x)
		}
		ticks += n
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}

// cpuMeter times one measured round's CPU on both sides.
type cpuMeter struct {
	servePID     int // 0: the server's CPU is not counted
	start        time.Time
	client, serv time.Duration
	servErr      error
}

func startCPUMeter(servePID int) *cpuMeter {
	m := &cpuMeter{servePID: servePID, start: time.Now(), client: selfCPU()}
	if servePID > 0 {
		m.serv, m.servErr = procCPU(servePID)
	}
	return m
}

// stop adds the round, which moved bytes, to the cell's sums; a server
// whose CPU could not be read leaves the cell's server sum without the
// round and says why.
func (m *cpuMeter) stop(c *cell, bytes float64) { m.stopInto(&c.cpuClient, &c.cpuServer, bytes) }

// stopInto adds the round to the sums client and server.
func (m *cpuMeter) stopInto(client, server *cpuUse, bytes float64) {
	wall := time.Since(m.start)
	client.add(selfCPU()-m.client, wall, bytes)
	if m.servePID <= 0 {
		return
	}
	now, err := procCPU(m.servePID)
	if m.servErr != nil {
		err = m.servErr
	}
	if err != nil {
		server.why = err.Error()
		return
	}
	server.add(now-m.serv, wall, bytes)
}

// iperfCPU sums what iperf3 reports for the rounds of one variant, each
// side's CPU seconds being its cpu_utilization_percent over the round's
// length.
type iperfCPU struct{ client, server cpuUse }

func (u *iperfCPU) add(r iperfResult) {
	wall := time.Duration(r.seconds * float64(time.Second))
	u.client.add(time.Duration(r.clientCores*float64(wall)), wall, r.bytes)
	u.server.add(time.Duration(r.serverCores*float64(wall)), wall, r.bytes)
}

// printCPU writes, per TCP cell that has a measure, each side's cores and
// cost per GB with its ratio to iperf3's, the baseline variant's beside.
func printCPU(out io.Writer, cells []cell) {
	header := false
	for _, c := range cells {
		if c.cpuClient.wall <= 0 {
			continue
		}
		if !header {
			fmt.Fprintln(out, "cpu: cores busy in the measured rounds and core-seconds per GB moved; client = the receiving side (iperf3 -R), server = the sending side")
			fmt.Fprintln(out, "cpus: the machine's CPUs at least 10% busy in those rounds (/proc/stat: user, nice, system, irq, softirq), with the softirq share, and the time stolen by the hypervisor over all CPUs; iperf3's span also holds its processes' start and exit")
			header = true
		}
		var base iperfCPU
		var baseCPUs cpuSpan
		variant := ""
		if best, _ := bestBaseline(c.baseRates); best >= 0 && best < len(c.baseCPU) {
			base, variant = c.baseCPU[best], c.variants[best].String()
			if best < len(c.cpusBase) {
				baseCPUs = c.cpusBase[best]
			}
		}
		line := fmt.Sprintf("cpu %s × %d (%s cell): fetch client %s%s, server %s%s",
			bytesize.Size(c.size), c.conns, c.verifyLabel(), c.cpuClient.cost(), versus(c.cpuClient, base.client),
			c.cpuServer.cost(), versus(c.cpuServer, base.server))
		if variant != "" {
			line += fmt.Sprintf("; iperf3 (%s) client %s, server %s", variant, base.client.cost(), base.server.cost())
		}
		fmt.Fprintln(out, line)
		line = fmt.Sprintf("cpus %s × %d (%s cell), busiest first: fetch %s", bytesize.Size(c.size), c.conns, c.verifyLabel(), c.cpusFetch.busiest(10, 8))
		if variant != "" {
			line += fmt.Sprintf("; iperf3 (%s) %s", variant, baseCPUs.busiest(10, 8))
		}
		fmt.Fprintln(out, line)
	}
}
