package e2e

import (
	"bufio"
	"fmt"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"
)

// TestServeWithoutRDMAUsesTCP runs the real binary where there is no RDMA
// device (this machine: the kernel has no RDMA support): each peer logs one
// line saying so and that the data plane is TCP, keeps serving, and shows
// the choice in `orbitkv peers` and metrics. --rdma-devices none says "off"
// instead; a named device that is absent is a warning.
func TestServeWithoutRDMAUsesTCP(t *testing.T) {
	if ents, _ := os.ReadDir("/sys/class/infiniband"); len(ents) > 0 {
		t.Skipf("this machine has RDMA devices (%d): the fallback is not what runs here", len(ents))
	}
	insecure := []string{"--cluster-addr", "127.0.0.1:0", "--cluster-insecure"}
	a := startPeer(t, t.TempDir(), append(insecure, "--node-name", "a")...)
	gossip, ok := a.log.find("cluster member")
	if !ok {
		t.Fatal("no cluster member line")
	}
	b := startPeer(t, t.TempDir(), append(insecure, "--node-name", "b", "--rdma-devices", "none", "--cluster-join", gossip["gossip"].(string))...)
	c := startPeer(t, t.TempDir(), append(insecure, "--node-name", "c", "--rdma-devices", "mlx5_0")...)
	for _, tc := range []struct {
		p            *proc
		level, start string
	}{
		{a, "info", "rdma: no RDMA device ("},
		{b, "info", "rdma: off (--rdma-devices none)"},
		{c, "warn", "rdma: no RDMA device ("},
	} {
		lines := tc.p.log.withPrefix("rdma: ")
		if len(lines) != 1 {
			t.Fatalf("%d rdma lines at start, want 1: %v", len(lines), lines)
		}
		msg, _ := lines[0]["message"].(string)
		if lines[0]["level"] != tc.level || !strings.HasPrefix(msg, tc.start) || !strings.HasSuffix(msg, "; data plane uses TCP") {
			t.Fatalf("rdma line %v, want level %s and %q…%q", lines[0], tc.level, tc.start, "; data plane uses TCP")
		}
		t.Logf("%s: %s", tc.level, msg)
	}
	waitFor(t, "b in a's peers over tcp", 15*time.Second, func() bool {
		out, err := a.cli(t, "peers")
		return err == nil && rowHas(out, "a (self)", "tcp (no local device)") && rowHas(out, "b ", "tcp (no local device)")
	})
	if out, err := b.cli(t, "peers"); err != nil || !rowHas(out, "b (self)", "tcp (rdma off)") {
		t.Fatalf("b's peers: %v\n%s", err, out)
	}
	if v, ok := scrapeSeries(t, a, `orbitkv_cluster_member_transport{member="b",transport="tcp"}`); !ok || v != 1 {
		t.Fatalf("a's transport gauge for b: %v %v", v, ok)
	}
	if v, ok := scrapeSeries(t, a, "orbitkv_cluster_transport_fallbacks_total"); !ok || v != 0 {
		t.Fatalf("fallbacks with no lane ever up: %v %v", v, ok)
	}
	if out, err := a.cli(t, "status"); err != nil {
		t.Fatalf("a does not serve after the fallback: %v\n%s", err, out)
	}
}

// rowHas says whether a line of out starts with first and contains want.
func rowHas(out, first, want string) bool {
	for _, l := range strings.Split(out, "\n") {
		if strings.HasPrefix(l, first) && strings.Contains(l, want) {
			return true
		}
	}
	return false
}

// withPrefix returns the lines whose message starts with prefix.
func (l *logLines) withPrefix(prefix string) []map[string]any {
	l.mu.Lock()
	defer l.mu.Unlock()
	var out []map[string]any
	for _, line := range l.lines {
		if m, _ := line["message"].(string); strings.HasPrefix(m, prefix) {
			out = append(out, line)
		}
	}
	return out
}

// scrapeSeries reads one series (name with its labels, as exported) from the
// peer's /metrics.
func scrapeSeries(t *testing.T, p *proc, series string) (float64, bool) {
	t.Helper()
	resp, err := http.Get("http://" + p.metrics + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if f := strings.Fields(sc.Text()); len(f) == 2 && f[0] == series {
			var v float64
			_, err := fmt.Sscan(f[1], &v)
			return v, err == nil
		}
	}
	return 0, false
}
