package restart

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestRestartTiny builds the orbitkv binary and times its restart over one
// 64 MiB SSD tier holding one saved page: the table's header, the no-SSD
// baseline row and the tier's row come out.
func TestRestartTiny(t *testing.T) {
	if testing.Short() {
		t.Skip("skipping: builds the orbitkv binary")
	}
	exe := filepath.Join(t.TempDir(), "orbitkv")
	build := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", exe, "github.com/orbitkv/orbitkv/cmd/orbitkv")
	build.Stderr = os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("build orbitkv: %v", err)
	}
	cfg := Config{Exe: exe, Dir: t.TempDir(), Sizes: []uint64{64 << 20}, Fill: 0.05, FillMax: 1 << 30, FileBytes: 64 << 20, Reps: 1}
	var out bytes.Buffer
	if err := Run(context.Background(), cfg, &out); err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"restart to serving (median of 1 starts", "ssd tier", "none", "64 MiB"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
