package gpu

import (
	"bytes"
	"context"
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/cuda"
)

// TestRunTiny runs the copy-method tables at a test's size (one batch of 4
// pages, 64 MiB pools, 2 timed batches). Without a GPU it skips, and fails
// instead under ORBITKV_REQUIRE=cuda (the GPU machine).
func TestRunTiny(t *testing.T) {
	cfg := Config{Pages: []int{4}, PoolBytes: 64 << 20, HostBytes: 64 << 20, Reps: 2, Warmup: 1, Streams: []int{2}, Sets: 2, Seed: 1}
	var out bytes.Buffer
	err := Run(context.Background(), cfg, &out)
	if errors.Is(err, cuda.ErrNotSupported) || errors.Is(err, cuda.ErrNoDriver) {
		if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), "cuda") {
			t.Fatalf("ORBITKV_REQUIRE=cuda but: %v", err)
		}
		t.Skipf("skipping: no GPU here (%v)", err)
	}
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	if strings.Contains(out.String(), "FAILED") || strings.Contains(out.String(), "error:") {
		t.Errorf("a method failed:\n%s", out.String())
	}
	for _, want := range []string{"batch of 4 pages", "64-token blocks", "16-token blocks", "contiguous pinned copy", "best restore:"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
