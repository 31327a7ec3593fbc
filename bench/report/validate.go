package report

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"sort"
)

// Validate loads every dir and applies the checks across runs: the same
// directory or run id twice, a (config, pair) cell filled twice, missing
// labels, and workload configs that differ.
func Validate(dirs []string) ([]*Run, []Rejection) {
	var runs []*Run
	var rej []Rejection
	byPath, byID := map[string]string{}, map[string]string{}
	for _, d := range dirs {
		abs, err := filepath.Abs(d)
		if err == nil {
			if e, err2 := filepath.EvalSymlinks(abs); err2 == nil {
				abs = e
			}
		}
		if prev, dup := byPath[abs]; dup {
			rej = append(rej, Rejection{d, "duplicated", fmt.Sprintf("the same run directory as %s", prev)})
			continue
		}
		byPath[abs] = d
		r, rr := Load(d)
		rej = append(rej, rr...)
		if id := r.Manifest.RunID; id != "" {
			if prev, dup := byID[id]; dup {
				rej = append(rej, Rejection{d, "duplicated", fmt.Sprintf("run id %s already given by %s (a copied run)", id, prev)})
				continue
			}
			byID[id] = d
		}
		runs = append(runs, r)
	}
	return runs, append(rej, crossChecks(runs)...)
}

func crossChecks(runs []*Run) []Rejection {
	var rej []Rejection
	cells := map[[2]string]string{}
	var ref map[string]any
	var refDir string
	for _, r := range runs {
		cfg, pair := r.Label("config"), r.Label("pair")
		if cfg == "" || pair == "" {
			rej = append(rej, Rejection{r.Dir, "unlabelled", "manifest needs labels config= and pair= (bench serving --label config=A --label pair=1)"})
			continue
		}
		cell := [2]string{cfg, pair}
		if prev, dup := cells[cell]; dup {
			rej = append(rej, Rejection{r.Dir, "duplicated", fmt.Sprintf("config %s pair %s already given by %s", cfg, pair, prev)})
		}
		cells[cell] = r.Dir
		m := comparableConfig(r)
		if ref == nil {
			ref, refDir = m, r.Dir
			continue
		}
		if k := firstDiff(ref, m); k != "" {
			rej = append(rej, Rejection{r.Dir, "not-comparable", fmt.Sprintf("workload setting %q differs from %s", k, refDir)})
		}
	}
	return rej
}

// comparableConfig is the run's config without what may differ between the
// configurations being compared (where the output went, which endpoints).
func comparableConfig(r *Run) map[string]any {
	b, _ := json.Marshal(r.Manifest.Config)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	for _, k := range []string{"output", "endpoint", "peer_metrics", "engine_metrics", "restart_cmd", "drain_timeout", "sample_every"} {
		delete(m, k)
	}
	return m
}

func firstDiff(a, b map[string]any) string {
	keys := map[string]bool{}
	for k := range a {
		keys[k] = true
	}
	for k := range b {
		keys[k] = true
	}
	sorted := make([]string, 0, len(keys))
	for k := range keys {
		sorted = append(sorted, k)
	}
	sort.Strings(sorted)
	for _, k := range sorted {
		x, _ := json.Marshal(a[k])
		y, _ := json.Marshal(b[k])
		if string(x) != string(y) {
			return k
		}
	}
	return ""
}
