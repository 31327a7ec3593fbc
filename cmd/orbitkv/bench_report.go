package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"path/filepath"

	"github.com/orbitkv/orbitkv/bench/report"
)

const benchReportUsage = `usage: orbitkv bench report [flags] RUN_DIR...

Validates 'bench serving' run directories and compares their configurations.
A run is rejected (non-zero exit, no report) when it failed (status, request
errors), is incomplete (no summary.json, truncated requests.jsonl, missing
manifest/metrics/drain), is duplicated (the same directory or run id twice, a
request index twice, two runs for one config in one pair) or out of budget
(peer gauges not drained, a query budget bypass), or has reused prompts whose
output differs from their serial reference without being labelled
non-deterministic ('bench serving --deterministic=false'; the report then
says so at the top). Runs are labelled by
'bench serving --label config=NAME --label pair=ID --label order=AB|BA';
each non-baseline configuration is compared with the baseline as the
geometric mean of per-pair ratios with a bootstrap interval over pairs
(none from a single pair; probe runs get no throughput ratio).

flags:
`

func runBenchReport(_ context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench report", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), benchReportUsage); fs.PrintDefaults() }
	opt := report.Options{Command: append([]string{"orbitkv", "bench", "report"}, args...)}
	fs.StringVar(&opt.Output, "output", "", "directory for report.md and the PNG plots (default: DIR/report next to the first run)")
	fs.StringVar(&opt.Baseline, "baseline", "", "baseline config label (default: native if present, else the first)")
	fs.StringVar(&opt.Ceiling, "ceiling", "", "config label of the ceiling run (default: ceiling); with it, each config's fraction recovered")
	fs.Float64Var(&opt.Level, "level", 0.95, "confidence level of the ratio intervals")
	fs.IntVar(&opt.Reps, "bootstrap", 10000, "bootstrap resamples")
	// Flags may follow the run directories.
	var dirs []string
	for {
		if err := fs.Parse(args); err != nil {
			return err
		}
		if fs.NArg() == 0 {
			break
		}
		dirs = append(dirs, fs.Arg(0))
		args = fs.Args()[1:]
	}
	if len(dirs) == 0 {
		fs.Usage()
		return fmt.Errorf("bench report: no run directories")
	}
	if opt.Output == "" {
		opt.Output = filepath.Join(filepath.Dir(filepath.Clean(dirs[0])), "report")
	}
	rep, err := report.Build(dirs, opt)
	if err != nil {
		return err
	}
	if nd := rep.Nondeterministic(); len(nd) > 0 {
		fmt.Fprintf(out, "bench report: NOT DETERMINISTIC: %d of %d runs labelled --deterministic=false; their outputs are not checked against references\n", len(nd), len(rep.Runs))
	}
	fmt.Fprintf(out, "bench report: %d runs accepted, configurations %v → %s\n", len(rep.Runs), rep.Configs, filepath.Join(opt.Output, "report.md"))
	for _, c := range rep.Comparisons {
		fmt.Fprintf(out, "  %-16s %s/%s = %.3f  (%.0f%% CI %s, %d pairs)\n", c.Metric.Name, c.Candidate, c.Baseline,
			c.Ratio.Est, opt.Level*100, c.Ratio.CIText(3), c.Ratio.N)
	}
	for _, r := range rep.Recovered {
		fmt.Fprintf(out, "  recovered        %s: %.3f of the ceiling (per pair %v)\n", r.Config, r.Fraction, r.PerPair)
	}
	return nil
}
