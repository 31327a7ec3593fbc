package soak

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"
)

// The peer processes and the namespaces: the same steps as
// integration/e2e's startPeerIn, threeHosts and partition (test files of
// another package, so copied rather than imported).

var binPath string

func TestMain(m *testing.M) {
	if os.Getenv(childEnv) != "" {
		os.Exit(engineChild())
	}
	if p := os.Getenv("ORBITKV_BIN"); p != "" || os.Getenv("ORBITKV_SOAK") == "" {
		binPath = p
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "orbitkv-soak-bin")
	if err != nil {
		fmt.Fprintln(os.Stderr, "soak:", err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "orbitkv")
	_, file, _, _ := runtime.Caller(0)
	cmd := exec.Command("go", "build", "-ldflags=-checklinkname=0", "-o", binPath, "./cmd/orbitkv")
	cmd.Dir, cmd.Stderr = filepath.Join(filepath.Dir(file), "..", ".."), os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "soak: build orbitkv:", err)
		os.RemoveAll(dir)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// proc is a running peer process.
type proc struct {
	cmd     *exec.Cmd
	socket  string
	metrics string
	exited  chan error
	lines   int
}

// serveArgs are the arguments of `orbitkv serve` for a soak peer: a DRAM
// tier about as large as a peer's own keys (with the pages it caches from
// the other members, the leases and the unflushed saves, pages are demoted
// and evicted from DRAM all the time), an SSD tier that holds them all (an
// acknowledged SSD page is never evicted for room, so every one must
// survive a kill).
func serveArgs(dataDir, metrics string, extra ...string) []string {
	return append([]string{"serve", "--data-dir", dataDir, "--metrics-addr", metrics,
		"--dram-bytes", "32MiB", "--dram-slab-bytes", "4MiB", "--ssd-bytes", "128MiB", "--ssd-file-bytes", "64MiB"}, extra...)
}

// startProc runs `orbitkv serve` (inside network namespace ns unless it is
// "") and waits for its "serving" line; an error if it exits first or does
// not serve within 60 s.
func startProc(ns string, args []string, logPath string) (*proc, error) {
	cmd := exec.Command(binPath, args...)
	if ns != "" { // ip netns exec execs the peer: the process is the peer's
		cmd = exec.Command("ip", append([]string{"netns", "exec", ns, binPath}, args...)...)
	}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return nil, err
	}
	logf, err := os.OpenFile(logPath, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, err
	}
	p := &proc{cmd: cmd, exited: make(chan error, 1)}
	ready := make(chan map[string]any, 1)
	go func() {
		defer logf.Close()
		sc := bufio.NewScanner(stderr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		sent := false
		for sc.Scan() {
			logf.Write(append(sc.Bytes(), '\n'))
			var line map[string]any
			if !sent && json.Unmarshal(sc.Bytes(), &line) == nil && line["message"] == "serving" {
				ready <- line
				sent = true
			}
		}
	}()
	go func() { p.exited <- cmd.Wait() }()
	select {
	case line := <-ready:
		p.socket, _ = line["socket"].(string)
		p.metrics, _ = line["metrics"].(string)
		return p, nil
	case err := <-p.exited:
		p.exited <- err
		return nil, fmt.Errorf("peer exited before serving: %v (log %s)", err, logPath)
	case <-time.After(60 * time.Second):
		p.kill()
		return nil, fmt.Errorf("peer did not report serving within 60 s (log %s)", logPath)
	}
}

func (p *proc) pid() int { return p.cmd.Process.Pid }

// kill sends SIGKILL and waits for the process to be gone.
func (p *proc) kill() {
	_ = p.cmd.Process.Kill()
	select {
	case err := <-p.exited:
		p.exited <- err
	case <-time.After(20 * time.Second):
	}
}

// stop sends SIGINT and waits for a clean exit.
func (p *proc) stop() error {
	_ = p.cmd.Process.Signal(os.Interrupt)
	select {
	case err := <-p.exited:
		p.exited <- err
		return err
	case <-time.After(30 * time.Second):
		p.kill()
		return fmt.Errorf("no exit within 30 s of SIGINT")
	}
}

// scrape reads the peer's metrics endpoint: every unlabelled series.
func scrape(addr string) (map[string]float64, error) {
	cl := http.Client{Timeout: 5 * time.Second}
	resp, err := cl.Get("http://" + addr + "/metrics")
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && !strings.HasPrefix(f[0], "#") {
			if v, err := strconv.ParseFloat(f[1], 64); err == nil {
				out[f[0]] = v
			}
		}
	}
	return out, sc.Err()
}

// host is one "host" of the cluster: a namespace with eth0 on the bridge.
type host struct{ ns, addr string }

// lan is three hosts on one bridge in a namespace of its own, and a link
// from this namespace to the bridge (proxy) for scraping the peers' metrics.
type lan struct {
	hosts   []host
	sw      string
	proxyIf string
	netem   bool
	mu      sync.Mutex
	made    []string
}

// skipNoNamespaces returns why namespaces cannot be made here, or "".
func skipNoNamespaces() string {
	if os.Geteuid() != 0 {
		return "network namespaces need root"
	}
	if _, err := exec.LookPath("ip"); err != nil {
		return "no ip command (iproute2; scripts/install-deps.sh installs it)"
	}
	return ""
}

func ipCmd(args ...string) error {
	if out, err := exec.Command("ip", args...).CombinedOutput(); err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, out)
	}
	return nil
}

// newLan makes n hosts, 10.77.N.1..n, and the proxy link 10.77.N.254.
// t.Cleanup removes them, after calling before (which ends the processes
// inside them).
func newLan(t *testing.T, n int, before func()) *lan {
	t.Helper()
	pid := os.Getpid()
	prefix := fmt.Sprintf("10.77.%d.", pid%250)
	l := &lan{sw: fmt.Sprintf("okv-soak-%d-sw", pid), proxyIf: fmt.Sprintf("oks%05dp0", pid%100000)}
	t.Cleanup(func() {
		before()
		for _, ns := range l.made {
			exec.Command("ip", "netns", "del", ns).Run()
		}
		exec.Command("ip", "link", "del", l.proxyIf).Run()
	})
	must := func(args ...string) {
		t.Helper()
		if err := ipCmd(args...); err != nil {
			t.Fatal(err)
		}
	}
	must("netns", "add", l.sw)
	l.made = append(l.made, l.sw)
	must("-n", l.sw, "link", "add", "br0", "type", "bridge")
	must("-n", l.sw, "link", "set", "br0", "up")
	for i := range n {
		h := host{ns: fmt.Sprintf("okv-soak-%d-%c", pid, 'a'+i), addr: fmt.Sprintf("%s%d", prefix, i+1)}
		must("netns", "add", h.ns)
		l.made = append(l.made, h.ns)
		hi, port := fmt.Sprintf("oks%05dh%d", pid%100000, i), fmt.Sprintf("oks%05ds%d", pid%100000, i)
		must("link", "add", hi, "type", "veth", "peer", "name", port)
		must("link", "set", hi, "netns", h.ns)
		must("-n", h.ns, "link", "set", hi, "name", "eth0")
		must("-n", h.ns, "addr", "add", h.addr+"/24", "dev", "eth0")
		must("-n", h.ns, "link", "set", "eth0", "up")
		must("-n", h.ns, "link", "set", "lo", "up")
		must("link", "set", port, "netns", l.sw)
		must("-n", l.sw, "link", "set", port, "master", "br0", "up")
		l.hosts = append(l.hosts, h)
	}
	p1 := fmt.Sprintf("oks%05dp1", pid%100000)
	must("link", "add", l.proxyIf, "type", "veth", "peer", "name", p1)
	must("link", "set", p1, "netns", l.sw)
	must("-n", l.sw, "link", "set", p1, "master", "br0", "up")
	must("addr", "add", prefix+"254/24", "dev", l.proxyIf)
	must("link", "set", l.proxyIf, "up")
	l.netem = netemWorks(l.hosts[0])
	return l
}

// netemWorks reports whether this kernel has the netem qdisc (sch_netem).
func netemWorks(h host) bool {
	err := exec.Command("ip", "netns", "exec", h.ns, "tc", "qdisc", "add", "dev", "eth0", "root", "netem", "delay", "1ms").Run()
	if err != nil {
		return false
	}
	exec.Command("ip", "netns", "exec", h.ns, "tc", "qdisc", "del", "dev", "eth0", "root").Run()
	return true
}

// partition cuts every packet between a and b, each still reaching the
// third host and the proxy: netem's 100% loss on a prio band that a u32
// filter sends the other's address to, where the kernel has netem, else
// blackhole routes. It returns how, and the function that heals it.
func (l *lan) partition(a, b host) (string, func() error, error) {
	if l.netem {
		for _, p := range [][2]host{{a, b}, {b, a}} {
			tc := func(args ...string) error {
				return ipCmd(append([]string{"netns", "exec", p[0].ns, "tc"}, args...)...)
			}
			if err := tc("qdisc", "add", "dev", "eth0", "root", "handle", "1:", "prio"); err != nil {
				return "", nil, err
			}
			if err := tc("qdisc", "add", "dev", "eth0", "parent", "1:3", "handle", "30:", "netem", "loss", "100%"); err != nil {
				return "", nil, err
			}
			if err := tc("filter", "add", "dev", "eth0", "parent", "1:0", "protocol", "ip", "u32", "match", "ip", "dst", p[1].addr+"/32", "flowid", "1:3"); err != nil {
				return "", nil, err
			}
		}
		return "netem loss 100%", func() error {
			return errors.Join(ipCmd("netns", "exec", a.ns, "tc", "qdisc", "del", "dev", "eth0", "root"),
				ipCmd("netns", "exec", b.ns, "tc", "qdisc", "del", "dev", "eth0", "root"))
		}, nil
	}
	if err := ipCmd("-n", a.ns, "route", "add", "blackhole", b.addr+"/32"); err != nil {
		return "", nil, err
	}
	if err := ipCmd("-n", b.ns, "route", "add", "blackhole", a.addr+"/32"); err != nil {
		ipCmd("-n", a.ns, "route", "del", "blackhole", b.addr+"/32")
		return "", nil, err
	}
	return "blackhole routes (no netem in this kernel)", func() error {
		return errors.Join(ipCmd("-n", a.ns, "route", "del", "blackhole", b.addr+"/32"),
			ipCmd("-n", b.ns, "route", "del", "blackhole", a.addr+"/32"))
	}, nil
}
