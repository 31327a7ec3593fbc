package ssd

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/bench/benchutil"
)

func TestBenchSSDSmall(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skipf("skipping: fio not on PATH (%v); install the fio package", err)
	}
	var out bytes.Buffer
	if err := Run(context.Background(), Config{Dir: t.TempDir(), PageBytes: 64 << 10, Pages: 64, Depth: 4}, &out); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, phase := range []string{"\nwrite ", "\nread "} {
		if !strings.Contains(out.String(), phase) {
			t.Fatalf("no %q row in:\n%s", phase, out.String())
		}
	}
}

// TestBenchSSDWarnsOnTmpfs: a directory on tmpfs (here /dev/shm, also one
// not created yet) gets a warning line that the numbers measure memory.
func TestBenchSSDWarnsOnTmpfs(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skipf("skipping: fio not on PATH (%v); install the fio package", err)
	}
	if benchutil.MemoryFS("/dev/shm") == "" {
		t.Skip("skipping: /dev/shm is not tmpfs on this machine")
	}
	shm, err := os.MkdirTemp("/dev/shm", "orbitkv-ssd-test-")
	if err != nil {
		t.Fatal(err)
	}
	defer os.RemoveAll(shm)
	const warning = "these numbers measure memory, not a disk"
	var out bytes.Buffer
	// O_DIRECT on tmpfs needs Linux 6.6; the warning comes first either way.
	err = Run(context.Background(), Config{Dir: filepath.Join(shm, "not-yet"), PageBytes: 64 << 10, Pages: 16, Depth: 4}, &out)
	if !strings.Contains(out.String(), "WARNING: "+filepath.Join(shm, "not-yet")+" is on tmpfs: "+warning) {
		t.Fatalf("no tmpfs warning (err %v) in:\n%s", err, out.String())
	}
	dir := t.TempDir()
	if benchutil.MemoryFS(dir) != "" {
		return // the test machine's temp dir is tmpfs too: nothing to contrast
	}
	out.Reset()
	if err := Run(context.Background(), Config{Dir: dir, PageBytes: 64 << 10, Pages: 16, Depth: 4}, &out); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(out.String(), warning) {
		t.Fatalf("warning for %s, not tmpfs:\n%s", dir, out.String())
	}
}
