package e2e

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// The reference engine (integration/python/orbitkv/refengine) as a real
// process, for tests that hand KV between engines.

// refEngineArgs: the tiny preset in exact mode (bit-identical across step
// shapes and restores), 4-token blocks, 16-token pages.
var refEngineArgs = []string{"--preset", "tiny", "--kv-tokens", "4096", "--block-size", "4", "--page-tokens", "16",
	"--attn-backend", "exact", "--request-timeout-s", "60"}

const refPageTokens = 16

// pythonRoot is integration/python.
func pythonRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "python")
}

// refPython returns the Python that runs the reference engine, skipping
// (and saying why) where it cannot run it bit-exact.
func refPython(t *testing.T) string {
	t.Helper()
	py := os.Getenv("ORBITKV_PYTHON")
	if py == "" {
		py = "/usr/bin/python3"
	}
	// The precondition of bit-identical outputs on a CPU (tests/test_refengine.py).
	const check = `import grpc, torch, torch.nn.functional as F
g = torch.Generator().manual_seed(0)
for k, n in [(64, 192), (64, 64), (128, 64), (64, 512), (16, 256)]:
    w, x = torch.randn((n, k), generator=g), torch.randn((97, k), generator=g)
    full = F.linear(x, w)
    for m in (1, 2, 5, 33):
        assert torch.equal(F.linear(x[-m:], w), full[-m:]), "this torch's CPU matmul is not row invariant (MKL)"
`
	cmd := exec.Command(py, "-c", check)
	cmd.Dir = pythonRoot()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Skipf("skipped: %s cannot run the reference engine bit-exact (scripts/install-deps.sh installs Debian's torch): %v\n%s",
			py, err, lastLines(string(out), 3))
	}
	return py
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// refEngine is a running `python3 -m orbitkv.refengine`.
type refEngine struct {
	name   string
	cmd    *exec.Cmd
	url    string
	exited chan error
	log    *lockedBuf
}

type lockedBuf struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuf) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuf) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// startRefEngine runs the reference engine in namespace ns ("" for this
// one) listening on host and waits for its "listening" line; its log is
// printed if the test fails.
func startRefEngine(t *testing.T, py, name, ns, host string, args ...string) *refEngine {
	t.Helper()
	argv := append([]string{py, "-m", "orbitkv.refengine", "--host", host, "--port", "0"}, refEngineArgs...)
	argv = append(argv, args...)
	if ns != "" {
		argv = append([]string{"ip", "netns", "exec", ns}, argv...)
	}
	e := &refEngine{name: name, cmd: exec.Command(argv[0], argv[1:]...), exited: make(chan error, 1), log: &lockedBuf{}}
	e.cmd.Dir = pythonRoot()
	e.cmd.Stderr = e.log
	stdout, err := e.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := e.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	url := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			if u, ok := strings.CutPrefix(sc.Text(), "refengine listening on "); ok {
				url <- u
			}
		}
	}()
	go func() { e.exited <- e.cmd.Wait() }()
	t.Cleanup(func() {
		e.stop()
		if t.Failed() {
			t.Logf("%s log (tail):\n%s", name, lastLines(e.log.String(), 40))
		}
	})
	select {
	case e.url = <-url:
	case err := <-e.exited:
		t.Fatalf("%s exited before serving: %v\n%s", name, err, lastLines(e.log.String(), 20))
	case <-time.After(90 * time.Second):
		t.Fatalf("%s did not serve within 90 s\n%s", name, lastLines(e.log.String(), 20))
	}
	return e
}

// stop sends SIGTERM, then SIGKILL if the engine has not exited in 10 s.
func (e *refEngine) stop() {
	if e.cmd.ProcessState != nil || e.cmd.Process == nil {
		return
	}
	_ = e.cmd.Process.Signal(os.Interrupt)
	select {
	case <-e.exited:
	case <-time.After(10 * time.Second):
		_ = e.cmd.Process.Kill()
		<-e.exited
	}
}

// completion is what a /v1/completions answer carries that the tests check.
type completion struct {
	Tokens   []int
	Restored int // usage.orbitkv_restored_tokens
	Params   map[string]any
	Took     time.Duration
}

// complete posts one completion (greedy) with the given kv_transfer_params.
func (e *refEngine) complete(ctx context.Context, prompt []int, maxTokens int, params map[string]any) (completion, error) {
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": maxTokens, "kv_transfer_params": params})
	req, err := http.NewRequestWithContext(ctx, "POST", e.url+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		return completion{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return completion{}, fmt.Errorf("%s: %w", e.name, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		return completion{}, fmt.Errorf("%s: HTTP %d: %s", e.name, resp.StatusCode, raw)
	}
	var out struct {
		Choices []struct {
			TokenIDs []int `json:"token_ids"`
		} `json:"choices"`
		Usage struct {
			Restored int `json:"orbitkv_restored_tokens"`
		} `json:"usage"`
		Params map[string]any `json:"kv_transfer_params"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) != 1 {
		return completion{}, fmt.Errorf("%s: bad answer %q: %v", e.name, raw, err)
	}
	return completion{Tokens: out.Choices[0].TokenIDs, Restored: out.Usage.Restored, Params: out.Params, Took: time.Since(start)}, nil
}

// metric reads one sample of the engine's /metrics (orbitkv_refengine_NAME;
// -1 when unreadable).
func (e *refEngine) metric(name string) float64 {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get(e.url + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	for _, line := range strings.Split(string(raw), "\n") {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "orbitkv_refengine_"+name {
			var v float64
			if _, err := fmt.Sscan(f[1], &v); err == nil {
				return v
			}
		}
	}
	return -1
}

// waitDrained waits until the engine holds no finished request's blocks
// and every block is free again (none leaked to a transfer).
func (e *refEngine) waitDrained(t *testing.T, d time.Duration) {
	t.Helper()
	waitFor(t, e.name+" to hold no blocks", d, func() bool {
		total := e.metric("kv_blocks")
		return total > 0 && e.metric("requests_held") == 0 && e.metric("kv_blocks_free") == total
	})
}
