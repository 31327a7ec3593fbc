package fabric

import (
	"io"
	"net/http"
	"os"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/internal/buildinfo"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// scrape returns the peer's whole /metrics text.
func (tp *testPeer) scrape() string {
	tp.t.Helper()
	resp, err := http.Get("http://" + tp.metricsAddr() + "/metrics")
	if err != nil {
		tp.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

func (tp *testPeer) get(path string) (int, string) {
	tp.t.Helper()
	resp, err := http.Get("http://" + tp.metricsAddr() + path)
	if err != nil {
		tp.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// TestSeriesPresentFromStart: before any request, the labelled counters
// show every label value at zero, the RED series of every method exist,
// orbitkv_build_info names the build, and the DRAM pool's free gauges show
// the whole pool free.
func TestSeriesPresentFromStart(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir())) // 4 slabs of 1 MiB
	body := tp.scrape()
	for _, want := range []string{
		`orbitkv_fabric_loaded_pages_total{tier="remote"} 0`,
		`orbitkv_fabric_loaded_pages_total{tier="ssd"} 0`,
		`orbitkv_tiers_evicted_pages_total{tier="ssd"} 0`,
		`orbitkv_tiers_ssd_dropped_pages_total{reason="corrupt"} 0`,
		`orbitkv_tiers_ssd_errors_total{op="write"} 0`,
		`orbitkv_fabric_rpcs_total{code="OK",method="Lookup"} 0`,
		`orbitkv_fabric_rpcs_total{code="ResourceExhausted",method="Save"} 0`,
		`orbitkv_fabric_rpc_duration_seconds_count{method="Load"} 0`,
		`orbitkv_fabric_rpc_duration_seconds_count{method="Status"} 0`,
		`orbitkv_fabric_op_duration_seconds_count{op="save"} 0`,
		`orbitkv_fabric_op_pages_total{op="load",result="not_found"} 0`,
		`orbitkv_cluster_fetch_duration_seconds_count 0`,
		`orbitkv_transfer_enqueue_seconds_count{phase="gates"} 0`,
		`orbitkv_build_info{go="` + buildinfo.GoVersion() + `",revision="` + buildinfo.Revision() + `",version="` + buildinfo.Version() + `"} 1`,
		"orbitkv_tiers_dram_free_bytes 4.194304e+06",
		"orbitkv_tiers_dram_free_slabs 4",
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestREDCountsCallsOpsAndErrors: each RPC is timed and counted by its
// code, a Save or Load by its pages' results.
func TestREDCountsCallsOpsAndErrors(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(3)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	if _, err := e.Lookup(ctx(t), keys, false); err != nil {
		t.Fatal(err)
	}
	missing := randKeys(2)
	if _, err := e.Load(ctx(t), refs(append(keys[:1:1], missing...), 32, 4)); err != nil {
		t.Fatal(err)
	}
	if _, err := e.C.Lookup(ctx(t), &pb.LookupRequest{SessionId: "no-such-session", Keys: keys}); err == nil {
		t.Fatal("lookup of an unknown session succeeded")
	}
	body := tp.scrape()
	for _, want := range []string{
		`orbitkv_fabric_rpcs_total{code="OK",method="OpenSession"} 1`,
		`orbitkv_fabric_rpcs_total{code="OK",method="Lookup"} 1`,
		`orbitkv_fabric_rpcs_total{code="NotFound",method="Lookup"} 1`,
		`orbitkv_fabric_rpc_duration_seconds_count{method="Lookup"} 2`,
		`orbitkv_fabric_op_duration_seconds_count{op="save"} 1`,
		`orbitkv_fabric_op_duration_seconds_count{op="load"} 1`,
		`orbitkv_fabric_op_pages_total{op="save",result="ok"} 3`,
		`orbitkv_fabric_op_pages_total{op="load",result="ok"} 1`,
		`orbitkv_fabric_op_pages_total{op="load",result="not_found"} 2`,
	} {
		if !strings.Contains(body, want+"\n") {
			t.Errorf("/metrics lacks %s", want)
		}
	}
}

// TestProbes: /healthz answers while the process serves; /readyz is 200
// while the peer serves engines and 503, with the reason, when the engine
// socket stops accepting (here: removed under the peer).
func TestProbes(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	if code, body := tp.get("/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, body := tp.get("/readyz"); code != 200 || body != "ready\n" {
		t.Fatalf("/readyz: %d %q", code, body)
	}
	if err := os.Remove(tp.cfg.Socket); err != nil {
		t.Fatal(err)
	}
	if code, body := tp.get("/readyz"); code != 503 || !strings.Contains(body, "socket "+tp.cfg.Socket) {
		t.Fatalf("/readyz without the socket: %d %q", code, body)
	}
}

// TestEveryMetricIsDocumented: every orbitkv_ series a standalone peer
// exports is named in docs/configuration.md.
func TestEveryMetricIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	tp := startPeer(t, smallConfig(t.TempDir()))
	seen := map[string]bool{}
	for _, line := range strings.Split(tp.scrape(), "\n") {
		if !strings.HasPrefix(line, "# TYPE orbitkv_") {
			continue
		}
		name := strings.Fields(line)[2]
		if !seen[name] && !strings.Contains(string(doc), "`"+name) {
			t.Errorf("%s is not documented in docs/configuration.md", name)
		}
		seen[name] = true
	}
	if len(seen) < 30 {
		t.Fatalf("only %d orbitkv_ series", len(seen))
	}
}
