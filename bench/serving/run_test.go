package serving

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

func testConfig(t *testing.T, endpoint string) Config {
	c := DefaultConfig()
	c.Endpoint, c.Output, c.Vocab = endpoint, filepath.Join(t.TempDir(), "run"), 512
	c.Prefixes, c.PrefixTokens, c.Concurrency = 3, []int{16, 32}, 4
	c.Duration, c.OutputTokens = Duration(300*time.Millisecond), 4
	c.RequestTimeout, c.DrainTimeout = Duration(5*time.Second), Duration(2*time.Second)
	c.SampleEvery = Duration(50 * time.Millisecond)
	return c
}

func readRowsFile(t *testing.T, dir string) []Row {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, RequestsFile))
	if err != nil {
		t.Fatal(err)
	}
	var rows []Row
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		var r Row
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatal(err)
		}
		rows = append(rows, r)
	}
	return rows
}

func TestRunSustainedMatchesReferences(t *testing.T) {
	f := &fakeEngine{firstDelay: 2 * time.Millisecond, tokenDelay: time.Millisecond}
	// Calls 1-3 are the prepare phase; corrupt the 8th call's output.
	f.corrupt = func(call int64) bool { return call == 8 }
	peer := httptest.NewServer(&fakePeer{busyScrapes: 2})
	defer peer.Close()
	cfg := testConfig(t, startFake(t, f))
	cfg.PeerMetrics = peer.URL + "/metrics"
	cfg.Concurrency = 1 // call n is request index n-4
	sum, err := Run(context.Background(), cfg, Manifest{Labels: map[string]string{"config": "x"}}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	rows := readRowsFile(t, cfg.Output)
	if sum.Rows != len(rows) || sum.Completed != len(rows) || sum.Failed != 0 || sum.Submitted != len(rows) {
		t.Fatalf("summary %+v vs %d rows", sum, len(rows))
	}
	var corrupted *Row
	for i := range rows {
		if rows[i].Index == 4 { // the 8th call is request index 4
			corrupted = &rows[i]
		}
	}
	switch {
	case corrupted == nil:
		t.Fatal("no request index 4")
	case corrupted.Reuse && (sum.Mismatches != 1 || sum.MismatchList[0].Index != 4):
		t.Errorf("reused request 4 was corrupted; summary lists %d mismatches %+v", sum.Mismatches, sum.MismatchList)
	case !corrupted.Reuse && sum.Mismatches != 0:
		t.Errorf("request 4 is new (no reference) yet %d mismatches", sum.Mismatches)
	}
	for _, r := range rows {
		if r.Reuse && r.Index != 4 && (r.MatchReference == nil || !*r.MatchReference) {
			t.Errorf("request %d reused prefix %d but did not match", r.Index, r.PrefixID)
		}
		if r.TTFTMS < 2 || r.LatencyMS < r.TTFTMS || len(r.ITLMS) != 3 {
			t.Errorf("request %d timings ttft %.2f latency %.2f itl %v", r.Index, r.TTFTMS, r.LatencyMS, r.ITLMS)
		}
	}
	// The window ends at the last completion. Admission closes at 0.3 s; with
	// one request in flight the last completion may come just before that
	// (the loop then finds the window closed), never before the last
	// admission and not by more than a request's latency.
	maxLat := 0.0
	for _, r := range rows {
		maxLat = max(maxLat, r.LatencyMS/1e3)
	}
	if sum.Drained == nil || !*sum.Drained || sum.WindowS < sum.AdmissionS || sum.WindowS < 0.3-maxLat-0.05 || sum.ThroughputRPS <= 0 {
		t.Errorf("drained %v window %.4f (last admission %.4f, longest request %.4f s) throughput %.1f",
			sum.Drained, sum.WindowS, sum.AdmissionS, maxLat, sum.ThroughputRPS)
	}
	var m map[string]*Window
	b, _ := os.ReadFile(filepath.Join(cfg.Output, MetricsFile))
	if err := json.Unmarshal(b, &m); err != nil || m["peer"].Delta["orbitkv_fabric_lookup_hit_pages_total"] <= 0 {
		t.Errorf("metrics.json peer deltas missing: %v %s", err, b)
	}
	if _, err := Run(context.Background(), cfg, Manifest{}, Options{}); err == nil || !strings.Contains(err.Error(), "already holds a run") {
		t.Errorf("a second run into the same directory: %v", err)
	}
}

func TestRunFailsWhenGaugesDoNotDrain(t *testing.T) {
	peer := httptest.NewServer(&fakePeer{busyScrapes: -1})
	defer peer.Close()
	cfg := testConfig(t, startFake(t, &fakeEngine{}))
	cfg.PeerMetrics, cfg.DrainTimeout = peer.URL+"/metrics", Duration(300*time.Millisecond)
	sum, err := Run(context.Background(), cfg, Manifest{}, Options{})
	if err == nil || sum.Status != "failed" || !strings.Contains(err.Error(), "did not drain") {
		t.Fatalf("status %s err %v", sum.Status, err)
	}
	var d Drain
	b, _ := os.ReadFile(filepath.Join(cfg.Output, DrainFile))
	if json.Unmarshal(b, &d) != nil || !d.Checked || d.OK || d.Gauges["orbitkv_fabric_leases"] != 1 {
		t.Errorf("drain.json %s", b)
	}
}

func TestRunRecordsFailedRequests(t *testing.T) {
	f := &fakeEngine{}
	url := startFake(t, f)
	cfg := testConfig(t, url)
	cfg.Workload, cfg.TracePath, cfg.TimeScale = WorkloadTrace, filepath.Join(t.TempDir(), "t.jsonl"), 0.01
	// Every request outlives its deadline.
	if err := os.WriteFile(cfg.TracePath, []byte(traceLines), 0o644); err != nil {
		t.Fatal(err)
	}
	f.firstDelay = 200 * time.Millisecond
	cfg.RequestTimeout = Duration(50 * time.Millisecond)
	sum, err := Run(context.Background(), cfg, Manifest{}, Options{})
	if err == nil || sum.Failed != 3 || !strings.Contains(sum.FirstErrors[0], "deadline") {
		t.Fatalf("err %v summary %+v", err, sum)
	}
}

func TestProbesPhases(t *testing.T) {
	cfg := testConfig(t, startFake(t, &fakeEngine{}))
	cfg.Workload, cfg.ProbeTokens, cfg.ProbeReps, cfg.FillerTokens = WorkloadProbes, 40, 2, 100
	sum, err := Run(context.Background(), cfg, Manifest{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	// Per rep: cold, resident, 3 fillers (40+40+20), evicted.
	if sum.Rows != 12 || sum.Phases[PhaseEvicted].N != 2 || sum.Phases[PhaseFiller].N != 6 || sum.Mismatches != 0 {
		t.Fatalf("summary %+v", sum)
	}
	if len(sum.Notes) != 1 || !strings.Contains(sum.Notes[0], "restart probe skipped") {
		t.Errorf("notes %v", sum.Notes)
	}
}

// TestRunKeepsEngineMetricsThatAreNotNumbers: SGLang 0.5.17's /metrics has
// gauges whose value is NaN (Prometheus' text format allows NaN and ±Inf; JSON
// has neither). On the H200 every SGLang run then failed with "json:
// unsupported value: NaN" and wrote no metrics.json. The series is left out of
// the sample and named, and the run stands.
func TestRunKeepsEngineMetricsThatAreNotNumbers(t *testing.T) {
	var scrapes atomic.Int64
	engine := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		n := scrapes.Add(1)
		fmt.Fprintf(w, "# TYPE sglang:prompt_tokens_total counter\nsglang:prompt_tokens_total %d\n", n*100)
		fmt.Fprint(w, "# TYPE sglang:spec_accept_rate gauge\nsglang:spec_accept_rate{tp_rank=\"0\"} NaN\n")
		fmt.Fprint(w, "# TYPE sglang:ratio gauge\nsglang:ratio +Inf\n")
	}))
	defer engine.Close()
	cfg := testConfig(t, startFake(t, &fakeEngine{tokenDelay: time.Millisecond}))
	cfg.EngineMetrics = engine.URL + "/metrics"
	sum, err := Run(context.Background(), cfg, Manifest{}, Options{})
	if err != nil || sum.Status != "ok" {
		t.Fatalf("run: %v, status %q %v", err, sum.Status, sum.Reasons)
	}
	var m map[string]*Window
	b, err := os.ReadFile(filepath.Join(cfg.Output, MetricsFile))
	if err != nil || json.Unmarshal(b, &m) != nil || m["engine"] == nil {
		t.Fatalf("metrics.json: %v %s", err, b)
	}
	w := m["engine"]
	if w.Delta["sglang:prompt_tokens_total"] <= 0 {
		t.Errorf("engine counter delta %v", w.Delta)
	}
	want := []string{`sglang:spec_accept_rate{tp_rank="0"}`, "sglang:ratio"}
	if !slices.Equal(w.After.NotFinite, want) {
		t.Errorf("not-finite series %q; want %q", w.After.NotFinite, want)
	}
}

// TestSustainedRestartMidRun: with --restart-at the window drains, runs the
// restart command once, waits for the engine and goes on: no request is in
// flight across the restart, requests complete before and after it, and
// summary.restart says when it happened and the rate before it.
func TestSustainedRestartMidRun(t *testing.T) {
	cfg := testConfig(t, startFake(t, &fakeEngine{firstDelay: 2 * time.Millisecond, tokenDelay: time.Millisecond}))
	marks := filepath.Join(t.TempDir(), "restarts")
	cfg.Duration, cfg.RestartAt = Duration(600*time.Millisecond), Duration(200*time.Millisecond)
	cfg.RestartCmd = "echo restarted >> " + marks + "; sleep 0.1"
	sum, err := Run(context.Background(), cfg, Manifest{}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(marks)
	if strings.Count(string(b), "restarted") != 1 {
		t.Fatalf("the restart command ran %d times", strings.Count(string(b), "restarted"))
	}
	rs := sum.Restart
	if rs == nil || rs.ReadyS < rs.DrainedS || rs.BeforeRPS <= 0 {
		t.Fatalf("restart %+v", rs)
	}
	var before, after int
	for _, row := range readRowsFile(t, cfg.Output) {
		end := row.StartS + row.LatencyMS/1e3
		switch {
		case row.Error != "":
			t.Errorf("request %d failed: %s", row.Index, row.Error)
		case end <= rs.DrainedS:
			before++
		case row.StartS >= rs.ReadyS:
			after++
		default:
			t.Errorf("request %d ran across the restart (%.3f-%.3f s; restart %.3f-%.3f)", row.Index, row.StartS, end, rs.DrainedS, rs.ReadyS)
		}
	}
	if before == 0 || after == 0 || sum.Failed != 0 {
		t.Errorf("%d requests before the restart, %d after, %d failed", before, after, sum.Failed)
	}
}

func TestRestartAtNeedsACommandAndTheSustainedWorkload(t *testing.T) {
	cfg := testConfig(t, "http://127.0.0.1:1")
	cfg.RestartAt = Duration(100 * time.Millisecond)
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "--restart-cmd") {
		t.Errorf("no command: %v", err)
	}
	cfg.RestartCmd, cfg.RestartAt = "true", cfg.Duration
	if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "inside --duration") {
		t.Errorf("at the window's end: %v", err)
	}
}
