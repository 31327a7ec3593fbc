package report

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
)

// Compare builds the report of the run directories dirs into opt.Output (by
// default DIR/report next to the first run) and prints its summary to out:
// a warning first when runs were not deterministic, then one line per
// comparison and per fraction of the ceiling recovered. (It is `orbitkv
// bench report`'s entry; Run is the name of one run directory here.)
func Compare(_ context.Context, dirs []string, opt Options, out io.Writer) error {
	if len(dirs) == 0 {
		return fmt.Errorf("bench report: no run directories")
	}
	if opt.Output == "" {
		opt.Output = filepath.Join(filepath.Dir(filepath.Clean(dirs[0])), "report")
	}
	rep, err := Build(dirs, opt)
	if err != nil {
		return err
	}
	if nd := rep.Nondeterministic(); len(nd) > 0 {
		fmt.Fprintf(out, "bench report: NOT DETERMINISTIC: %d of %d runs labelled --deterministic=false; their outputs are not checked against references\n", len(nd), len(rep.Runs))
	}
	fmt.Fprintf(out, "bench report: %d runs accepted, configurations %v → %s\n", len(rep.Runs), rep.Configs, filepath.Join(opt.Output, "report.md"))
	for _, c := range rep.Comparisons {
		fmt.Fprintf(out, "  %-18s %s/%s = %.3f  (%.0f%% CI %s, %d pairs)\n", c.Metric.Name, c.Candidate, c.Baseline,
			c.Ratio.Est, opt.Level*100, c.Ratio.CIText(3), c.Ratio.N)
	}
	for _, r := range rep.Recovered {
		fmt.Fprintf(out, "  recovered        %s: %.3f of the ceiling (per pair %v)\n", r.Config, r.Fraction, r.PerPair)
	}
	return nil
}
