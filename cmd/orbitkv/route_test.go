package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuf is a buffer one goroutine writes while another reads.
type syncBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuf) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuf) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// TestRouteProxyPrintsCounts: route-proxy ends by saying how its requests
// went, so a benchmark can tell a routed run that never routed (a wrong
// --layout, a peer too slow for --route-timeout) from one that did.
func TestRouteProxyPrintsCounts(t *testing.T) {
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "{}") }))
	defer eng.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var out syncBuf
	done := make(chan error, 1)
	go func() {
		done <- runRouteProxy(ctx, []string{"--listen", "127.0.0.1:0", "--round-robin", "--engine", "e=" + eng.URL}, &out)
	}()
	var url string
	deadline := time.Now().Add(30 * time.Second) // a hang guard, not a measurement
	for url == "" {
		if _, u, ok := strings.Cut(out.String(), "route-proxy listening on "); ok {
			url = strings.TrimSpace(u)
			break
		}
		select {
		case err := <-done:
			t.Fatalf("route-proxy ended before listening: %v\n%s", err, out.String())
		case <-time.After(10 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatal("route-proxy did not say where it listens")
		}
	}
	for range 2 {
		resp, err := http.Post(url+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2]}`))
		if err != nil {
			t.Fatal(err)
		}
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("route-proxy did not end after its context")
	}
	if want := "route-proxy: 0 requests routed, 2 round robin; 0 route queries failed or timed out\n"; !strings.HasSuffix(out.String(), want) {
		t.Errorf("output %q does not end with %q", out.String(), want)
	}
}
