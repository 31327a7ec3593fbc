package lookup

import (
	"context"
	"strings"
	"testing"
)

// TestBenchLookupPrintsTheAskSketchBesideTheCatalog: bench lookup times the
// catalog alone and, on the same queries, with the peer's ask sketch
// (fabric/store/readmit.go) in front, one line each.
func TestBenchLookupPrintsTheAskSketchBesideTheCatalog(t *testing.T) {
	var b strings.Builder
	if err := Run(context.Background(), Config{Entries: 4096, Chain: 128, Iters: 200}, &b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"catalog lookup: 4096 entries", "200 lookups of 128-key chains", "counted on the path", "counted off the path", "lookups' keys dropped", "target p99"} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
}
