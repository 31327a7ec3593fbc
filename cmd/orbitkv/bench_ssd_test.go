package main

import (
	"bytes"
	"context"
	"os/exec"
	"strings"
	"testing"
)

func TestBenchSSDSmall(t *testing.T) {
	if _, err := exec.LookPath("fio"); err != nil {
		t.Skipf("skipping: fio not on PATH (%v); install the fio package", err)
	}
	var out bytes.Buffer
	if err := benchSSD(context.Background(), &out, t.TempDir(), 64<<10, 64, 4); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + out.String())
	for _, phase := range []string{"\nwrite ", "\nread "} {
		if !strings.Contains(out.String(), phase) {
			t.Fatalf("no %q row in:\n%s", phase, out.String())
		}
	}
}
