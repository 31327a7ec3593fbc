package fabric

import (
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"
)

// TestSSDDiscardCrashAtEachStep (issue 34, item 6c): a start with
// --ssd-discard that dies at any step of the discard (after its marker,
// after the catalog forgot the pages, after a page file went, after the
// files, after the trim) must leave a data dir whose next start proceeds,
// even without --ssd-discard (the flag set for one rollout only): it
// finishes the discard, keeps the pages inside the tier and serves none
// of those beyond. Before, a crash after the catalog's commit left the
// files beyond the tier, and the next start refused to drop them again.
func TestSSDDiscardCrashAtEachStep(t *testing.T) {
	for _, step := range []string{"marker", "catalog", "file", "files", "trim"} {
		t.Run(step, func(t *testing.T) {
			fx := newSSDFixture(t)
			smaller := fx.cfg
			smaller.SSDBytes, smaller.SSDDiscard = 64<<20, true
			t.Setenv("ORBITKV_TEST_DISCARD_CRASH", step)
			p, err := New(smaller, zerolog.New(io.Discard))
			if err == nil {
				p.Close()
				t.Fatalf("the discard did not stop after step %s", step)
			}
			if !strings.Contains(err.Error(), "ORBITKV_TEST_DISCARD_CRASH") {
				t.Fatalf("start: %v, want the injected crash", err)
			}
			os.Unsetenv("ORBITKV_TEST_DISCARD_CRASH")
			next := smaller
			next.SSDDiscard = false
			fx.check(t, next, tinyFlash)
			if _, err := os.Stat(filepath.Join(fx.cfg.DataDir, "ssd", "orbitkv-discard")); !os.IsNotExist(err) {
				t.Fatalf("discard marker after the discard finished: %v", err)
			}
			fx.check(t, next, tinyFlash) // and the start after that
		})
	}
}
