package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/fabric"
)

// TestStatusOverRelativeSocket: `orbitkv status --socket data/orbitkv.sock`
// (the README's command, and the flag's default) reaches a peer through a
// socket path relative to the working directory.
func TestStatusOverRelativeSocket(t *testing.T) {
	dir := t.TempDir()
	cfg := fabric.DefaultConfig()
	cfg.DataDir, cfg.MetricsAddr, cfg.CUDA = filepath.Join(dir, "data"), "", "off"
	cfg.DRAMBytes, cfg.DRAMSlabBytes, cfg.SSDBytes = 16<<20, 4<<20, 0
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	p, err := fabric.New(cfg, zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	ctx, stop := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	defer func() { stop(); <-done }()
	t.Chdir(dir)
	var out bytes.Buffer
	deadline := time.Now().Add(20 * time.Second)
	for {
		out.Reset()
		err = runStatus(context.Background(), []string{"--socket", "data/orbitkv.sock", "--timeout", "2s"}, &out)
		if err == nil || time.Now().After(deadline) {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil || !strings.HasPrefix(out.String(), "healthy") {
		t.Fatalf("status over data/orbitkv.sock: %v\n%s", err, out.String())
	}
}
