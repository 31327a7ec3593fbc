package main

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
// waits (the 16-core runs of docs/benchmarks.md, "On 16 cores": one fetch
// connection moved 58–70% of one iperf3 stream, and a second connection
// added 15–25%). The client is the receiving side in both tools (iperf3
// runs with -R); the server is this binary's --serve process (its pid known
// through --serve-pid; --netns passes it) and iperf3's server.

// cpuUse sums CPU time and the wall time it was spent in.
type cpuUse struct{ cpu, wall time.Duration }

func (u *cpuUse) add(cpu, wall time.Duration) { u.cpu, u.wall = u.cpu+cpu, u.wall+wall }

// cores is how many cores were busy on average; 0 when nothing was timed.
func (u cpuUse) cores() float64 {
	if u.wall <= 0 {
		return 0
	}
	return u.cpu.Seconds() / u.wall.Seconds()
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

// stop adds the round to the cell's sums; a server whose CPU could not be
// read leaves the cell's server sum untouched (and reported as unknown).
func (m *cpuMeter) stop(c *cell) {
	wall := time.Since(m.start)
	c.cpuClient.add(selfCPU()-m.client, wall)
	if m.servePID <= 0 || m.servErr != nil {
		return
	}
	if now, err := procCPU(m.servePID); err == nil {
		c.cpuServer.add(now-m.serv, wall)
	}
}

// iperfCPU sums the cores iperf3 reports busy per round of one variant.
type iperfCPU struct {
	client, server float64 // cores, summed over rounds
	rounds         int
}

func (u *iperfCPU) add(r iperfResult) {
	u.client, u.server, u.rounds = u.client+r.clientCores, u.server+r.serverCores, u.rounds+1
}

// coreCost formats cores busy and the core-seconds per GB they spent at
// gbps GB/s; "?" when unknown.
func coreCost(cores, gbps float64) string {
	if cores <= 0 || gbps <= 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f cores (%.3f s/GB)", cores, cores/gbps)
}

// printCPU writes, per TCP cell that has a measure, each side's cores and
// cost per GB, the baseline variant's beside them.
func printCPU(out io.Writer, cells []cell) {
	header := false
	for _, c := range cells {
		if c.cpuClient.wall <= 0 {
			continue
		}
		if !header {
			fmt.Fprintln(out, "cpu: cores busy in the measured rounds and core-seconds per GB moved; client = the receiving side (iperf3 -R), server = the sending side")
			header = true
		}
		line := fmt.Sprintf("cpu %s × %d (%s cell): fetch client %s, server %s",
			bytesize.Size(c.size), c.conns, c.verifyLabel(), coreCost(c.cpuClient.cores(), c.gbps), coreCost(c.cpuServer.cores(), c.gbps))
		if best, base := bestBaseline(c.baseRates); best >= 0 && best < len(c.baseCPU) && c.baseCPU[best].rounds > 0 {
			u, n := c.baseCPU[best], float64(c.baseCPU[best].rounds)
			line += fmt.Sprintf("; iperf3 (%s) client %s, server %s", c.variants[best], coreCost(u.client/n, base/8), coreCost(u.server/n, base/8))
		}
		fmt.Fprintln(out, line)
	}
}
