package main

import (
	"strings"
	"testing"
)

// TestStatusOverRelativeSocket: `orbitkv status --socket data/orbitkv.sock`
// (the README's command, and the flag's default) reaches a peer through a
// socket path relative to the working directory.
func TestStatusOverRelativeSocket(t *testing.T) {
	dir := t.TempDir()
	startCLIPeer(t, dir)
	t.Chdir(dir)
	if out := statusUntilServing(t, []string{"--socket", "data/orbitkv.sock"}); !strings.HasPrefix(out, "healthy") {
		t.Fatalf("status over data/orbitkv.sock:\n%s", out)
	}
}
