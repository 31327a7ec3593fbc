package report

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestCompareSummarizes: bench report's entry writes report.md next to the
// first run by default and prints one line per comparison.
func TestCompareSummarizes(t *testing.T) {
	dirs := goodRuns(t)
	var out bytes.Buffer
	if err := Compare(context.Background(), dirs, Options{Level: 0.95, Reps: 200}, &out); err != nil {
		t.Fatal(err)
	}
	md := filepath.Join(filepath.Dir(dirs[0]), "report", "report.md")
	if _, err := os.Stat(md); err != nil {
		t.Fatalf("no report.md: %v", err)
	}
	for _, want := range []string{"bench report: 4 runs accepted", "throughput", "orbitkv/native = ", "95% CI"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
	if err := Compare(context.Background(), nil, Options{}, &out); err == nil {
		t.Error("no run directories: no error")
	}
}
