package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/bench/serving"
	"github.com/orbitkv/orbitkv/fabric"
)

const python = "/usr/bin/python3"

// needTorch skips when the reference engine cannot run here, saying why.
func needTorch(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("-short: the reference engine run takes ~30 s")
	}
	if out, err := exec.Command(python, "-c", "import torch").CombinedOutput(); err != nil {
		t.Skipf("%s cannot import torch (%v: %s); the reference engine needs python3-torch", python, err, bytes.TrimSpace(out))
	}
}

// freeAddr returns a loopback address that was free a moment ago.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// startTestPeer runs an OrbitKV peer in this process; it returns its socket
// and metrics URL and stops it at cleanup.
func startTestPeer(t *testing.T) (socket, metrics string) {
	t.Helper()
	cfg := fabric.DefaultConfig()
	cfg.DataDir, cfg.MetricsAddr = t.TempDir(), freeAddr(t)
	cfg.DRAMBytes, cfg.DRAMSlabBytes, cfg.SSDBytes = 64<<20, 1<<20, 0
	p, err := fabric.New(cfg, zerolog.New(io.Discard))
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil && ctx.Err() == nil {
			t.Errorf("peer: %v", err)
		}
	})
	socket, metrics = filepath.Join(cfg.DataDir, "orbitkv.sock"), "http://"+cfg.MetricsAddr+"/metrics"
	waitFor(t, 20*time.Second, "peer socket and metrics", func() bool {
		if _, err := os.Stat(socket); err != nil {
			return false
		}
		resp, err := http.Get(metrics)
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return socket, metrics
}

func waitFor(t *testing.T, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s not ready within %s", what, d)
		}
		<-tick.C
	}
}

// startRefEngine runs the reference engine (tiny preset) and returns its URL;
// it is stopped (SIGTERM, then SIGKILL) and waited for at cleanup.
func startRefEngine(t *testing.T, kvTokens string, extra ...string) string {
	t.Helper()
	args := append([]string{"-m", "orbitkv.refengine", "--preset", "tiny", "--port", "0", "--kv-tokens", kvTokens}, extra...)
	cmd := exec.Command(python, args...)
	cmd.Dir = filepath.Join("..", "..", "integration", "python")
	var stderr bytes.Buffer // read only after the process exited
	cmd.Stderr = &stderr
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	t.Cleanup(func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			_ = cmd.Process.Kill()
			<-exited
		}
		if t.Failed() {
			t.Logf("reference engine stderr:\n%s", lastBytes(stderr.Bytes(), 4000))
		}
	})
	urls := make(chan string, 1)
	go func() {
		defer close(exited)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "refengine listening on "); ok {
				urls <- u
			}
		}
		_ = cmd.Wait()
	}()
	select {
	case u := <-urls:
		return u
	case <-exited:
		t.Fatal("reference engine exited before listening")
	case <-time.After(60 * time.Second):
		t.Fatal("reference engine did not listen within 60 s")
	}
	return ""
}

func lastBytes(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

func readSummary(t *testing.T, dir string) serving.Summary {
	t.Helper()
	var s serving.Summary
	b, err := os.ReadFile(filepath.Join(dir, serving.SummaryFile))
	if err == nil {
		err = json.Unmarshal(b, &s)
	}
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// TestBenchServingReferenceEngine is the short CPU run of `bench serving`
// against the reference engine without and with OrbitKV, then `bench report`
// over the pair, and a report that must reject a truncated copy.
func TestBenchServingReferenceEngine(t *testing.T) {
	needTorch(t)
	root := t.TempDir()
	workload := []string{"--vocab", "512", "--prefixes", "6", "--prefix-tokens", "128,256,512",
		"--concurrency", "4", "--duration", "4s", "--output-tokens", "8", "--request-timeout", "60s", "--quiet"}
	ctx := context.Background()
	run := func(name, endpoint string, extra ...string) string {
		out := filepath.Join(root, name)
		args := append([]string{"serving", "--endpoint", endpoint, "--output", out,
			"--label", "config=" + name, "--label", "pair=1", "--label", "order=AB"}, workload...)
		var buf bytes.Buffer
		if err := runBench(ctx, append(args, extra...), &buf); err != nil {
			t.Fatalf("bench serving %s: %v\n%s", name, err, buf.String())
		}
		t.Logf("%s:\n%s", name, buf.String())
		return out
	}
	// The engine pool (1,024 tokens) is smaller than the 1,792-token working set.
	native := run("native", startRefEngine(t, "1024"))
	socket, metrics := startTestPeer(t)
	orbit := run("orbitkv", startRefEngine(t, "1024", "--connector", "orbitkv", "--orbitkv-socket", socket),
		"--peer-metrics", metrics)

	for _, dir := range []string{native, orbit} {
		if s := readSummary(t, dir); s.Status != "ok" || s.Failed != 0 || s.Mismatches != 0 || s.Completed == 0 {
			t.Errorf("%s: %+v", dir, s)
		}
	}
	var m map[string]*serving.Window
	b, _ := os.ReadFile(filepath.Join(orbit, serving.MetricsFile))
	if err := json.Unmarshal(b, &m); err != nil || m["peer"] == nil {
		t.Fatalf("metrics.json: %v", err)
	}
	if d := m["peer"].Delta; d["orbitkv_fabric_lookup_hit_pages_total"] <= 0 || d["orbitkv_fabric_loaded_tokens_total"] <= 0 {
		t.Errorf("no pages restored through OrbitKV in the window: %v", d)
	}

	var out bytes.Buffer
	if err := runBench(ctx, []string{"report", "--output", filepath.Join(root, "report"), native, orbit}, &out); err != nil {
		t.Fatalf("bench report: %v", err)
	}
	t.Log(out.String())

	// A truncated copy of the OrbitKV run must be rejected.
	bad := filepath.Join(root, "truncated")
	if err := os.MkdirAll(bad, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{serving.ManifestFile, serving.SummaryFile, serving.MetricsFile, serving.DrainFile, serving.RequestsFile} {
		b, err := os.ReadFile(filepath.Join(orbit, f))
		if err != nil {
			t.Fatal(err)
		}
		if f == serving.RequestsFile {
			b = b[:len(b)/2]
		}
		if err := os.WriteFile(filepath.Join(bad, f), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	err := runBench(ctx, []string{"report", "--output", filepath.Join(root, "report2"), native, bad}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "incomplete") {
		t.Fatalf("bench report accepted a truncated run: %v", err)
	}
}

// TestBenchServingDeterministicLabel: --deterministic=false is written to
// the manifest (bench report reads it); the default claims determinism.
func TestBenchServingDeterministicLabel(t *testing.T) {
	eng := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		w.Write([]byte("data: {\"choices\":[{\"text\":\"a\"}]}\n\ndata: [DONE]\n\n"))
	})
	srv := &http.Server{Handler: eng}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Close()
	for _, tc := range []struct {
		flag string
		want bool
	}{{"", true}, {"--deterministic=false", false}} {
		dir := filepath.Join(t.TempDir(), "run")
		args := []string{"--endpoint", "http://" + l.Addr().String(), "--output", dir, "--quiet", "--vocab", "64",
			"--prefixes", "1", "--prefix-tokens", "8", "--concurrency", "1", "--duration", "50ms", "--output-tokens", "1"}
		if tc.flag != "" {
			args = append(args, tc.flag)
		}
		if err := runBenchServing(context.Background(), args, io.Discard); err != nil {
			t.Fatalf("%q: %v", tc.flag, err)
		}
		var m serving.Manifest
		b, _ := os.ReadFile(filepath.Join(dir, serving.ManifestFile))
		if err := json.Unmarshal(b, &m); err != nil || m.Deterministic == nil || *m.Deterministic != tc.want {
			t.Errorf("%q: manifest deterministic %v (%v), want %v", tc.flag, m.Deterministic, err, tc.want)
		}
	}
	err = runBenchServing(context.Background(), []string{"--output", t.TempDir() + "/x", "--deterministic=false", "--require-match"}, io.Discard)
	if err == nil || !strings.Contains(err.Error(), "contradicts") {
		t.Errorf("--require-match with --deterministic=false: %v", err)
	}
}
