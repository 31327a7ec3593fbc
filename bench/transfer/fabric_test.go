package transfer

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"
)

// TestRunFabricTiny: a serve side and a fetch side on loopback at a test's
// size; the fetch side prints its rounds (no iperf3 baseline asked for).
func TestRunFabricTiny(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	cfg := DefaultFabricConfig()
	cfg.PageBytes, cfg.Pages, cfg.Batch, cfg.Rounds, cfg.Seconds = 64<<10, 8, 4, 1, 0.2
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	srv := cfg
	srv.Serve = addr
	go func() { served <- RunFabric(ctx, srv, &bytes.Buffer{}) }()
	defer func() { cancel(); <-served }()
	cl := cfg
	cl.Fetch = addr
	var out bytes.Buffer
	for deadline := time.Now().Add(20 * time.Second); ; {
		out.Reset()
		err = RunFabric(context.Background(), cl, &out)
		if err == nil || !strings.Contains(err.Error(), "connection refused") || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond) // the serve side is still binding: poll with a deadline
	}
	if err != nil {
		t.Fatalf("fetch: %v\n%s", err, out.String())
	}
	t.Log("\n" + out.String())
	for _, want := range []string{"bench fabric: 8 pages of 65536 bytes", "round 1: fetch", "median"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("output lacks %q:\n%s", want, out.String())
		}
	}
}
