package transfer

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/transfer/tcp"
)

func TestPlanCellAlternates(t *testing.T) {
	for _, tc := range []struct{ rounds, variants int }{{1, 0}, {1, 1}, {3, 2}, {5, 4}} {
		t.Run(fmt.Sprintf("%d rounds × %d variants", tc.rounds, tc.variants), func(t *testing.T) {
			plan := planCell(tc.rounds, tc.variants)
			if len(plan) != 1+tc.rounds*(1+tc.variants) {
				t.Fatalf("%d steps: %v", len(plan), plan)
			}
			if plan[0] != (step{variant: -1, round: 0}) {
				t.Fatalf("first step %v, want the OrbitKV warm-up", plan[0])
			}
			// Every baseline round r comes after OrbitKV round r and before
			// OrbitKV round r+1: the tools alternate round by round.
			ours := 0
			seen := make([]int, tc.variants)
			for i, s := range plan[1:] {
				if s.variant < 0 {
					if s.round != ours+1 {
						t.Fatalf("step %d: OrbitKV round %d after round %d", i+1, s.round, ours)
					}
					for v, n := range seen {
						if n != ours {
							t.Fatalf("step %d: OrbitKV round %d with variant %d at %d rounds", i+1, s.round, v, n)
						}
					}
					ours = s.round
					continue
				}
				if seen[s.variant]++; s.round != ours || seen[s.variant] != ours {
					t.Fatalf("step %d: variant %d round %d while OrbitKV is at round %d", i+1, s.variant, s.round, ours)
				}
			}
			if ours != tc.rounds {
				t.Fatalf("%d OrbitKV rounds counted, want %d", ours, tc.rounds)
			}
		})
	}
}

func TestIperfVariants(t *testing.T) {
	for _, tc := range []struct {
		size  uint64
		conns int
		want  []string
	}{
		{128 << 10, 1, []string{"-P 1, default -l"}},
		{256 << 10, 1, []string{"-P 1, default -l", "-P 1, -l 256KiB"}},
		{2 << 20, 2, []string{"-P 2, default -l", "-P 2, -l 1MiB", "2 procs × -P 1, default -l", "2 procs × -P 1, -l 1MiB"}},
		{4 << 10, 3, []string{"-P 3, default -l", "-P 3, -l 4KiB", "3 procs × -P 1, default -l", "3 procs × -P 1, -l 4KiB"}},
	} {
		vs := iperfVariants(tc.size, tc.conns)
		var got []string
		for _, v := range vs {
			got = append(got, v.String())
			if v.procs*v.streams != tc.conns {
				t.Errorf("%d B × %d: %s has %d streams", tc.size, tc.conns, v, v.procs*v.streams)
			}
		}
		if strings.Join(got, "; ") != strings.Join(tc.want, "; ") {
			t.Errorf("%d B × %d: %q, want %q", tc.size, tc.conns, got, tc.want)
		}
	}
}

func TestBestBaseline(t *testing.T) {
	for _, tc := range []struct {
		name  string
		rates [][]float64
		best  int
		v     float64
	}{
		{"none", nil, -1, 0},
		{"one", [][]float64{{3, 1, 2}}, 0, 2},
		{"median not max", [][]float64{{1, 9, 1}, {2, 2, 2}}, 1, 2},
		{"empty skipped", [][]float64{{}, {5}}, 1, 5},
	} {
		if b, v := bestBaseline(tc.rates); b != tc.best || v != tc.v {
			t.Errorf("%s: %d %g, want %d %g", tc.name, b, v, tc.best, tc.v)
		}
	}
}

// countingSource counts the requests it answers.
type countingSource struct {
	p *transferPages
	n atomic.Int64
}

func (s *countingSource) Open(ctx context.Context, wants []tcp.Want) ([]tcp.Page, func()) {
	s.n.Add(1)
	return s.p.Open(ctx, wants)
}

// TestTransferMatrixInterleavesBaseline runs TCP READ cells against a fake
// iperf3: within each cell the baseline's rounds alternate with the cell's
// own (some requests are served between one baseline round and the next
// round's first, none between variants of one round), each variant runs
// once per round for the round's length, and the cell reports the variant
// with the best median.
func TestTransferMatrixInterleavesBaseline(t *testing.T) {
	b := smallTransferBench(t)
	b.Transports, b.Ops, b.Rounds = []string{"tcp"}, []string{"read"}, 3
	b.ServePID = os.Getpid() // the server runs in this process: its CPU is read through /proc
	src := &countingSource{p: b.pages(true)}
	addr := serveTransfer(t, src)
	type call struct {
		v        iperfVariant
		requests int64
	}
	var calls []call
	b.Baseline = func(_ context.Context, v iperfVariant, d time.Duration) (iperfResult, error) {
		if d != b.round() {
			t.Errorf("baseline round of %v, want %v", d, b.round())
		}
		calls = append(calls, call{v, src.n.Load()})
		// Rounds 1, 2, 3 of a variant in a cell give 11, 12, 13 Gbit/s (median 12);
		// the variant with -l set and one process 20 more (median 32).
		n := 0
		for _, c := range calls {
			if c.v == v {
				n++
			}
		}
		rate := 10.0 + float64((n-1)%b.Rounds+1)
		if v.len != 0 && v.procs == 1 {
			rate += 20
		}
		// Each round's cores follow its rate (client rate/100, server rate/200),
		// so the CPU line shows which variant's rounds it summed.
		secs := d.Seconds()
		return iperfResult{gbps: rate, clientCores: rate / 100, serverCores: rate / 200, bytes: rate / 8 * 1e9 * secs, seconds: secs}, nil
	}
	var out bytes.Buffer
	if err := b.client(context.Background(), &out, addr); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	i := 0
	for _, n := range b.Conns {
		for _, size := range b.Sizes {
			vs := iperfVariants(size, n)
			for r := range b.Rounds {
				for j, v := range vs {
					c := calls[i]
					if c.v != v {
						t.Fatalf("call %d: variant %s, want %s (%d B × %d, round %d)", i, c.v, v, size, n, r+1)
					}
					if j == 0 && i > 0 && c.requests <= calls[i-1].requests {
						t.Errorf("call %d: no OrbitKV round since the last baseline round (%d requests)", i, c.requests)
					}
					if j > 0 && c.requests != calls[i-1].requests {
						t.Errorf("call %d: OrbitKV requests between variants of one round", i)
					}
					i++
				}
			}
		}
	}
	if i != len(calls) {
		t.Fatalf("%d baseline calls, want %d", len(calls), i)
	}
	for _, l := range strings.Split(out.String(), "\n") {
		if f := strings.Fields(l); len(f) > 8 && f[0] == "tcp" && (f[7] != "32.0" || !strings.HasSuffix(f[8], "%")) {
			t.Errorf("row without the best variant's median (32.0) as its baseline: %q", l)
		}
		if strings.Contains(l, "<- baseline") && !strings.Contains(l, "-P 2, -l") && !strings.Contains(l, "-P 1, -l") {
			t.Errorf("wrong variant marked: %q", l)
		}
	}
	if got := strings.Count(out.String(), "<- baseline"); got != len(b.Sizes)*len(b.Conns) {
		t.Errorf("%d baselines marked, want one per cell:\n%s", got, out.String())
	}
	// The CPU lines: the best variant's rounds (31, 32, 33 Gbit/s) as iperf3
	// reported them, 0.32 / 0.16 cores on average and 8 / 4 core-seconds per
	// 100 GB; the other variants' (11–13 Gbit/s) would read 0.12 / 0.06. The
	// fetch's both sides measured, each with its ratio to iperf3's.
	cpu := 0
	fetch := regexp.MustCompile(`fetch client [0-9.]+ cores \([0-9.]+ s/GB\) = [0-9.]+× iperf3's, server [0-9.]+ cores \([0-9.]+ s/GB\) = [0-9.]+× iperf3's;`)
	for _, l := range strings.Split(out.String(), "\n") {
		if !strings.HasPrefix(l, "cpu ") {
			continue
		}
		cpu++
		if !strings.Contains(l, "client 0.32 cores (0.080 s/GB), server 0.16 cores (0.040 s/GB)") {
			t.Errorf("CPU line without the best variant's cores: %q", l)
		}
		if !fetch.MatchString(l) {
			t.Errorf("CPU line without the fetch's two sides and their ratios: %q", l)
		}
	}
	if cpu != len(b.Sizes)*len(b.Conns) {
		t.Errorf("%d CPU lines, want one per cell:\n%s", cpu, out.String())
	}
	// Each cell's busiest CPUs, for the fetch's rounds and the baseline's
	// (this machine's /proc/stat; the busy CPUs themselves vary run to run).
	cpus := regexp.MustCompile(`^cpus .* busiest first: fetch .*; steal [0-9.]+%; iperf3 \(-P [12], -l [^)]*\) .*; steal [0-9.]+%$`)
	n := 0
	for _, l := range strings.Split(out.String(), "\n") {
		if strings.HasPrefix(l, "cpus ") {
			n++
			if !cpus.MatchString(l) {
				t.Errorf("per-CPU line without both tools' CPUs and steal: %q", l)
			}
		}
	}
	if n != len(b.Sizes)*len(b.Conns) {
		t.Errorf("%d per-CPU lines, want one per cell:\n%s", n, out.String())
	}
}

func TestTransferMatrixWholeSecondsBesideIperf3(t *testing.T) {
	for _, tc := range []struct {
		secs float64
		ok   bool
	}{{1, true}, {2, true}, {0.5, false}, {1.5, false}} {
		b := transferBench{Seconds: tc.secs}
		if err := b.checkWholeSeconds(); (err == nil) != tc.ok {
			t.Errorf("--seconds %g: %v", tc.secs, err)
		}
	}
}
