package transfer

import (
	"context"
	"encoding/json"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/internal/bytesize"
)

// The iperf3 baseline of bench transfer, measured per cell and interleaved
// with the cell's own rounds (OrbitKV, then each iperf3 variant, round
// after round), so that drift on a shared machine between the two tools
// lands on both alike. iperf3 runs at its best: the same link and
// direction (-R: the server side sends, as the fetch's server does), the
// same total number of streams as the cell's connections, the kernel's
// autotuned socket buffers (the serve side of the fetch and of the streams
// asks for --serve-sndbuf, tcp.DefaultSendBuffer unless told), its own
// default write size and one equal
// to the page size (capped at iperf3's 1 MiB), and for several connections
// also one process per stream (iperf3 3.12 drives all of a process's
// streams from one thread: on two cores -P 2 gave 29–40 Gbit/s, two
// processes 47–53, the scheduler running each stream's two ends on one
// core). The cell's baseline is the variant with the highest median.

// iperfVariant is one way of running iperf3 for a cell: procs processes at
// once, each with -P streams, each writing len bytes per call (0: iperf3's
// default, 128 KiB for TCP).
type iperfVariant struct {
	procs, streams int
	len            uint64
}

// iperfMaxLen is the largest write iperf3 accepts (-l).
const iperfMaxLen = 1 << 20

// iperfDefaultLen is iperf3's default TCP write size.
const iperfDefaultLen = 128 << 10

func (v iperfVariant) String() string {
	l := "default -l"
	if v.len != 0 {
		l = "-l " + bytesize.Size(v.len).String()
	}
	if v.procs == 1 {
		return fmt.Sprintf("-P %d, %s", v.streams, l)
	}
	return fmt.Sprintf("%d procs × -P %d, %s", v.procs, v.streams, l)
}

// iperfVariants are the variants measured for a cell of page size and
// conns connections: each has conns streams in all.
func iperfVariants(size uint64, conns int) []iperfVariant {
	lens := []uint64{0}
	if l := min(size, iperfMaxLen); l != iperfDefaultLen {
		lens = append(lens, l)
	}
	procs := []int{1}
	if conns > 1 {
		procs = append(procs, conns)
	}
	var out []iperfVariant
	for _, p := range procs {
		for _, l := range lens {
			out = append(out, iperfVariant{procs: p, streams: conns / p, len: l})
		}
	}
	return out
}

// step is one run in a cell's plan: an OrbitKV round (variant -1; round 0
// is the warm-up, not counted) or one round of iperf3 variant.
type step struct {
	variant, round int
}

// planCell orders a cell's runs: an OrbitKV warm-up, then per round one
// OrbitKV round followed by one round of each of the variants, so the two
// tools alternate (A B A B …) and each tool's rounds spread over the cell.
func planCell(rounds, variants int) []step {
	plan := []step{{variant: -1, round: 0}}
	for r := 1; r <= rounds; r++ {
		plan = append(plan, step{variant: -1, round: r})
		for v := range variants {
			plan = append(plan, step{variant: v, round: r})
		}
	}
	return plan
}

// bestBaseline returns the index of the variant whose rates (Gbit/s, one
// per round) have the highest median, and that median; -1 if none.
func bestBaseline(rates [][]float64) (int, float64) {
	best, v := -1, 0.0
	for i, r := range rates {
		if len(r) == 0 {
			continue
		}
		if m := benchutil.Median(r); best < 0 || m > v {
			best, v = i, m
		}
	}
	return best, v
}

// iperfRunner runs one round of a variant for d and returns the rate
// received and the cores iperf3 reports busy on each side.
type iperfRunner func(ctx context.Context, v iperfVariant, d time.Duration) (iperfResult, error)

// iperfResult is one iperf3 round: the rate received in Gbit/s, and the
// cores its client (the receiver, -R) and its server kept busy, from its
// -J report's cpu_utilization_percent (host_total, remote_total: a
// process's CPU time over the test's length), summed over processes.
type iperfResult struct {
	gbps, clientCores, serverCores float64
	bytes, seconds                 float64 // received in all, over the test's length
}

// iperf3Against runs variants against iperf3 servers on host, ports
// port, port+1, … (one per process).
func iperf3Against(host string, port int) iperfRunner {
	return func(ctx context.Context, v iperfVariant, d time.Duration) (iperfResult, error) {
		secs := max(1, int(d.Round(time.Second).Seconds()))
		res := make([]iperfResult, v.procs)
		errs := make([]error, v.procs)
		var wg sync.WaitGroup
		for p := range v.procs {
			wg.Go(func() { res[p], errs[p] = iperf3Reverse(ctx, host, port+p, v, secs) })
		}
		wg.Wait()
		var sum iperfResult
		for p := range v.procs {
			if errs[p] != nil {
				return iperfResult{}, fmt.Errorf("iperf3 %s, process %d: %w", v, p, errs[p])
			}
			sum.gbps += res[p].gbps
			sum.clientCores += res[p].clientCores
			sum.serverCores += res[p].serverCores
			sum.bytes += res[p].bytes
			sum.seconds = max(sum.seconds, res[p].seconds) // the processes run side by side
		}
		return sum, nil
	}
}

// iperf3Reverse runs one iperf3 client with -R (the server sends) and
// returns what it received and the CPU it reports.
func iperf3Reverse(ctx context.Context, host string, port int, v iperfVariant, secs int) (iperfResult, error) {
	args := []string{"-c", host, "-p", fmt.Sprint(port), "-R", "-J", "-P", fmt.Sprint(v.streams), "-t", fmt.Sprint(secs)}
	if v.len != 0 {
		args = append(args, "-l", fmt.Sprint(v.len))
	}
	return iperf3Parse(exec.CommandContext(ctx, "iperf3", args...).Output())
}

// iperf3Parse reads an iperf3 client's -J output (its process's Output
// and error): the received rate and both sides' CPU.
func iperf3Parse(b []byte, err error) (iperfResult, error) {
	if err != nil {
		return iperfResult{}, fmt.Errorf("%v: %s", err, strings.TrimSpace(string(b)))
	}
	var r struct {
		End struct {
			SumReceived struct {
				BitsPerSecond float64 `json:"bits_per_second"`
				Bytes         float64 `json:"bytes"`
				Seconds       float64 `json:"seconds"`
			} `json:"sum_received"`
			CPU struct {
				Host   float64 `json:"host_total"`
				Remote float64 `json:"remote_total"`
			} `json:"cpu_utilization_percent"`
		} `json:"end"`
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return iperfResult{}, fmt.Errorf("iperf3 output: %w", err)
	}
	sr := r.End.SumReceived
	return iperfResult{gbps: sr.BitsPerSecond / 1e9, clientCores: r.End.CPU.Host / 100, serverCores: r.End.CPU.Remote / 100,
		bytes: sr.Bytes, seconds: sr.Seconds}, nil
}
