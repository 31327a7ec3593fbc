package serving

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// PrintSummary prints a run's summary as `orbitkv bench serving` shows it:
// the counts, the latency percentiles, the probes' phases, then why it failed.
func PrintSummary(out io.Writer, c Config, s Summary) {
	fmt.Fprintf(out, "bench serving %s → %s: %s\n", c.Workload, c.Output, s.Status)
	fmt.Fprintf(out, "  requests   %d completed, %d failed, %d reused, %d output mismatches\n", s.Completed, s.Failed, s.Reused, s.Mismatches)
	fmt.Fprintf(out, "  window     %.2f s (admission %.2f s)   throughput %.2f req/s, %.0f output tok/s\n", s.WindowS, s.AdmissionS, s.ThroughputRPS, s.OutputTokPS)
	fmt.Fprintf(out, "  TTFT ms    p50 %.1f  p90 %.1f  p99 %.1f\n", s.TTFTMS.P50, s.TTFTMS.P90, s.TTFTMS.P99)
	fmt.Fprintf(out, "  ITL ms     p50 %.2f  p90 %.2f  p99 %.2f\n", s.ITLMS.P50, s.ITLMS.P90, s.ITLMS.P99)
	fmt.Fprintf(out, "  latency ms p50 %.1f  p90 %.1f  p99 %.1f\n", s.LatencyMS.P50, s.LatencyMS.P90, s.LatencyMS.P99)
	for _, ph := range []string{PhaseCold, PhaseResident, PhaseEvicted, PhaseRestart} {
		if st, ok := s.Phases[ph]; ok {
			fmt.Fprintf(out, "  probe %-9s TTFT ms p50 %.1f (n=%d)\n", ph, st.P50, st.N)
		}
	}
	if s.Drained != nil {
		fmt.Fprintf(out, "  peer gauges drained: %v\n", *s.Drained)
	}
	for _, r := range s.Reasons {
		fmt.Fprintf(out, "  FAILED: %s\n", r)
	}
	for _, n := range s.Notes {
		fmt.Fprintf(out, "  note: %s\n", n)
	}
}

// GitRevision is HEAD of the repository the binary was built in (bin/orbitkv
// in a checkout), else of the working directory's, else "unknown".
func GitRevision(ctx context.Context) (rev string, dirty bool) {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	dirs := []string{"."}
	if exe, err := os.Executable(); err == nil {
		dirs = append([]string{filepath.Dir(exe)}, dirs...)
	}
	for _, d := range dirs {
		b, err := exec.CommandContext(ctx, "git", "-C", d, "rev-parse", "HEAD").Output()
		if err != nil {
			continue
		}
		st, err := exec.CommandContext(ctx, "git", "-C", d, "status", "--porcelain", "--untracked-files=no").Output()
		return strings.TrimSpace(string(b)), err == nil && len(strings.TrimSpace(string(st))) > 0
	}
	return "unknown", false
}

// IsTerminal says whether f is a terminal (progress then redraws one line).
func IsTerminal(f *os.File) bool {
	_, err := unix.IoctlGetTermios(int(f.Fd()), unix.TCGETS)
	return err == nil
}
