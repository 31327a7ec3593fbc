package main

import (
	"context"
	"flag"
	"fmt"
	"io"

	"github.com/orbitkv/orbitkv/bench/report"
)

func runBenchReport(ctx context.Context, args []string, out io.Writer) error {
	const usage = `usage: orbitkv bench report [flags] RUN_DIR...

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
	fs := flag.NewFlagSet("bench report", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
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
	return report.Compare(ctx, dirs, opt, out)
}
