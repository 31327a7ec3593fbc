package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

var binPath string

func TestMain(m *testing.M) {
	code, err := buildAndRun(m)
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		os.Exit(1)
	}
	os.Exit(code)
}

// buildAndRun builds the binary under test (or takes ORBITKV_BIN) and runs
// the tests.
func buildAndRun(m *testing.M) (int, error) {
	if p := os.Getenv("ORBITKV_BIN"); p != "" {
		binPath = p
		return m.Run(), nil
	}
	dir, err := os.MkdirTemp("", "orbitkv-e2e-bin")
	if err != nil {
		return 0, err
	}
	defer os.RemoveAll(dir)
	binPath = filepath.Join(dir, "orbitkv")
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Join(filepath.Dir(file), "..", "..")
	cmd := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", binPath, "./cmd/orbitkv")
	cmd.Dir, cmd.Stderr = root, os.Stderr
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("build orbitkv: %w", err)
	}
	return m.Run(), nil
}

// proc is a running peer process.
type proc struct {
	cmd     *exec.Cmd
	dataDir string
	socket  string
	metrics string
	exited  chan error
	log     *logLines
}

// startPeer runs `orbitkv serve` on dataDir and waits for its "serving" line.
func startPeer(t *testing.T, dataDir string, extra ...string) *proc {
	t.Helper()
	return startPeerIn(t, "", dataDir, extra...)
}

// startPeerIn is startPeer inside network namespace ns ("" for this one).
func startPeerIn(t *testing.T, ns, dataDir string, extra ...string) *proc {
	t.Helper()
	args := serveArgs(dataDir, extra...)
	cmd := exec.Command(binPath, args...)
	if ns != "" { // ip netns exec execs the peer: the process is the peer's
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, binPath}, args...)...)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	p := &proc{cmd: cmd, dataDir: dataDir, exited: make(chan error, 1), log: &logLines{}}
	ready := make(chan map[string]any, 1)
	go scanLog(stderr, ready, p.log)
	go func() { p.exited <- cmd.Wait() }()
	t.Cleanup(func() { p.kill() })
	select {
	case line := <-ready:
		p.socket, _ = line["socket"].(string)
		p.metrics, _ = line["metrics"].(string)
	case err := <-p.exited:
		t.Fatalf("peer exited before serving: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("peer did not report serving within 30s")
	}
	return p
}

// logLines keeps a peer's decoded log lines.
type logLines struct {
	mu    sync.Mutex
	lines []map[string]any
	n     int // lines, decodable or not
}

// find returns the first line with message msg.
func (l *logLines) find(msg string) (map[string]any, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if line["message"] == msg {
			return line, true
		}
	}
	return nil, false
}

func (l *logLines) count() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.n
}

// serveArgs are the arguments of `orbitkv serve` for a test peer.
func serveArgs(dataDir string, extra ...string) []string {
	return append([]string{"serve", "--data-dir", dataDir, "--metrics-addr", "127.0.0.1:0",
		"--dram-bytes", "32MiB", "--dram-slab-bytes", "4MiB", "--ssd-bytes", "128MiB", "--ssd-file-bytes", "64MiB"}, extra...)
}

// scanLog keeps the log lines, forwards the first "serving" line and
// drains the rest.
func scanLog(r interface{ Read([]byte) (int, error) }, ready chan<- map[string]any, keep *logLines) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sent := false
	for sc.Scan() {
		var line map[string]any
		ok := json.Unmarshal(sc.Bytes(), &line) == nil
		keep.mu.Lock()
		keep.n++
		if ok && len(keep.lines) < 10000 {
			keep.lines = append(keep.lines, line)
		}
		keep.mu.Unlock()
		if ok && line["message"] == "serving" && !sent {
			ready <- line
			sent = true
		}
	}
}

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	if p.cmd.ProcessState != nil {
		return
	}
	_ = p.cmd.Process.Kill()
	select {
	case <-p.exited:
	case <-time.After(10 * time.Second):
	}
}

// stop sends SIGTERM and waits for a clean exit.
func (p *proc) stop(t *testing.T) {
	t.Helper()
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-p.exited:
		if err != nil {
			t.Fatalf("peer exit: %v", err)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("peer did not stop within 20s of SIGINT")
	}
}

// cli runs an orbitkv admin command against the peer.
func (p *proc) cli(t *testing.T, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	args = append(args, "--socket", p.socket)
	out, err := exec.CommandContext(ctx, binPath, args...).CombinedOutput()
	return strings.TrimSpace(string(out)), err
}
