package report

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/orbitkv/orbitkv/bench/serving"
)

// Run is one loaded run directory.
type Run struct {
	Dir      string
	Manifest serving.Manifest
	Summary  serving.Summary
	Rows     []serving.Row
	Metrics  map[string]*serving.Window
	Drain    serving.Drain
}

// Label returns a manifest label.
func (r *Run) Label(k string) string { return r.Manifest.Labels[k] }

// Rejection is why a run cannot be used, by kind: failed, incomplete,
// duplicated, out-of-budget, mismatch (reused prompts differ from their
// references in a run not labelled non-deterministic), unlabelled or
// not-comparable.
type Rejection struct {
	Dir, Kind, Why string
}

func (r Rejection) String() string { return fmt.Sprintf("%s: %s: %s", r.Dir, r.Kind, r.Why) }

// RejectedError lists every rejection; bench report exits non-zero with it.
type RejectedError struct{ Rejections []Rejection }

func (e *RejectedError) Error() string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d problem(s); no report written:", len(e.Rejections))
	for _, r := range e.Rejections {
		b.WriteString("\n  " + r.String())
	}
	return b.String()
}

// Load reads one run directory, returning what it found and every reason to
// reject it (checks that need other runs are in Validate).
func Load(dir string) (*Run, []Rejection) {
	r := &Run{Dir: dir}
	var rej []Rejection
	bad := func(kind, format string, a ...any) {
		rej = append(rej, Rejection{dir, kind, fmt.Sprintf(format, a...)})
	}
	if err := readJSON(dir, serving.ManifestFile, &r.Manifest); err != nil {
		bad("incomplete", "%v", err)
	}
	if err := readJSON(dir, serving.SummaryFile, &r.Summary); err != nil {
		bad("incomplete", "%v (the run did not finish)", err)
		return r, rej
	}
	rows, err := readRows(filepath.Join(dir, serving.RequestsFile))
	r.Rows = rows
	if err != nil {
		bad("incomplete", "%v", err)
	} else if len(rows) != r.Summary.Rows {
		bad("incomplete", "%s has %d rows, summary.json says %d", serving.RequestsFile, len(rows), r.Summary.Rows)
	}
	seen := map[int]int{}
	for i, row := range rows {
		if first, dup := seen[row.Index]; dup {
			bad("duplicated", "request index %d appears twice (lines %d and %d)", row.Index, first+1, i+1)
			break
		}
		seen[row.Index] = i
	}
	if r.Summary.Status != "ok" {
		bad("failed", "status %q: %s", r.Summary.Status, strings.Join(r.Summary.Reasons, "; "))
	}
	failed := 0
	for _, row := range rows {
		if row.Error != "" {
			failed++
		}
	}
	if failed > 0 && r.Summary.Status == "ok" {
		bad("failed", "%d requests have errors", failed)
	}
	if s := r.Summary; s.Mismatches > 0 && r.Manifest.IsDeterministic() {
		bad("mismatch", "%d of %d reused prompts differ from their serial reference, so a wrong restore could not be told apart: "+
			"rerun on a batch-invariant engine, or label the run non-deterministic (bench serving --deterministic=false) to compare it anyway",
			s.Mismatches, s.Reused)
	}
	rej = append(rej, r.loadBudget()...)
	return r, rej
}

// loadBudget reads drain.json and metrics.json and checks the budgets.
func (r *Run) loadBudget() []Rejection {
	var rej []Rejection
	bad := func(kind, format string, a ...any) {
		rej = append(rej, Rejection{r.Dir, kind, fmt.Sprintf(format, a...)})
	}
	if err := readJSON(r.Dir, serving.MetricsFile, &r.Metrics); err != nil {
		bad("incomplete", "%v", err)
	}
	if err := readJSON(r.Dir, serving.DrainFile, &r.Drain); err != nil {
		bad("incomplete", "%v", err)
		return rej
	}
	if r.Manifest.PeerMetrics != "" && !r.Drain.Checked {
		bad("incomplete", "peer metrics were given but the drain check did not run")
	}
	if r.Drain.Checked && !r.Drain.OK {
		bad("out-of-budget", "peer gauges not drained within %gs: %v", r.Drain.TimeoutS, r.Drain.Gauges)
	}
	if w := r.Metrics["peer"]; w != nil {
		if w.Error != "" {
			bad("incomplete", "peer metrics: %s", w.Error)
		}
		for k, v := range w.Delta {
			if strings.Contains(k, "budget_bypass") || strings.Contains(k, "budget_exceeded") {
				if v > 0 {
					bad("out-of-budget", "query budget bypass recorded: %s += %g", k, v)
				}
			}
		}
		if lim, err := strconv.ParseFloat(r.Label("query_budget_bytes"), 64); err == nil {
			if p := w.Peak["orbitkv_fabric_query_bytes"]; p > lim {
				bad("out-of-budget", "query bytes peaked at %.0f, over the %.0f-byte budget", p, lim)
			}
		}
	}
	return rej
}

func readJSON(dir, name string, v any) error {
	b, err := os.ReadFile(filepath.Join(dir, name))
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("no %s", name)
	}
	if err != nil {
		return err
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("%s: %v", name, err)
	}
	return nil
}

// readRows parses requests.jsonl strictly: a line that is not a whole JSON
// object, or a last line without its newline, is a truncated file.
func readRows(path string) ([]serving.Row, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no %s", filepath.Base(path))
	}
	if err != nil {
		return nil, err
	}
	if len(b) > 0 && b[len(b)-1] != '\n' {
		return nil, fmt.Errorf("%s is truncated: its last line has no newline", filepath.Base(path))
	}
	var rows []serving.Row
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	for n := 1; sc.Scan(); n++ {
		var row serving.Row
		dec := json.NewDecoder(bytes.NewReader(sc.Bytes()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&row); err != nil {
			return rows, fmt.Errorf("%s line %d is not a request row (truncated?): %v", filepath.Base(path), n, err)
		}
		rows = append(rows, row)
	}
	return rows, sc.Err()
}
