package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
	corev1 "k8s.io/api/core/v1"
)

// startPeer runs `orbitkv serve` on a fresh data dir with a small DRAM pool,
// in a standalone cluster of one, every port chosen by the kernel, and
// returns its addresses once it logs "serving".
func startPeer(t *testing.T) servingLine {
	t.Helper()
	dir := t.TempDir()
	cmd := exec.Command(binPath, "serve", "--data-dir", filepath.Join(dir, "data"), "--metrics-addr", "127.0.0.1:0",
		"--dram-bytes", "32MiB", "--dram-slab-bytes", "4MiB", "--query-budget-bytes", "16MiB",
		"--ssd-bytes", "128MiB", "--ssd-file-bytes", "64MiB", "--cuda", "off",
		"--cluster-addr", "127.0.0.1:0", "--cluster-insecure")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
	})
	serving := make(chan servingLine, 1)
	go scanServing(stderr, serving)
	select {
	case addr := <-serving:
		return addr
	case err := <-exited:
		t.Fatalf("peer exited before serving: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("peer did not log serving within 60 s")
	}
	return servingLine{}
}

// servingLine is the peer's "serving" log line: where it listens.
type servingLine struct{ Message, Metrics, Socket string }

// scanServing sends the first "serving" line, then drains the log.
func scanServing(r io.Reader, serving chan<- servingLine) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sent := false
	for sc.Scan() {
		var line servingLine
		if !sent && json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "serving" {
			serving <- line
			sent = true
		}
	}
}

// scrape reads every series the peer exports, histogram and summary series
// (_bucket, _sum, _count) expanded, as Prometheus would store them.
func scrape(t *testing.T, addr string) []labels.Labels {
	t.Helper()
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	families, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse /metrics: %v", err)
	}
	var series []labels.Labels
	for name, f := range families {
		for _, m := range f.GetMetric() {
			series = append(series, expand(name, f.GetType(), m)...)
		}
	}
	return series
}

func expand(name string, typ dto.MetricType, m *dto.Metric) []labels.Labels {
	base := map[string]string{}
	for _, lp := range m.GetLabel() {
		base[lp.GetName()] = lp.GetValue()
	}
	one := func(n string, extra ...string) labels.Labels {
		l := map[string]string{"__name__": n}
		for k, v := range base {
			l[k] = v
		}
		for i := 0; i+1 < len(extra); i += 2 {
			l[extra[i]] = extra[i+1]
		}
		return labels.FromMap(l)
	}
	switch typ {
	case dto.MetricType_HISTOGRAM:
		out := []labels.Labels{one(name + "_sum"), one(name + "_count")}
		for _, b := range m.GetHistogram().GetBucket() {
			out = append(out, one(name+"_bucket", "le", fmt.Sprint(b.GetUpperBound())))
		}
		return append(out, one(name+"_bucket", "le", "+Inf"))
	case dto.MetricType_SUMMARY:
		out := []labels.Labels{one(name + "_sum"), one(name + "_count")}
		for _, q := range m.GetSummary().GetQuantile() {
			out = append(out, one(name, "quantile", fmt.Sprint(q.GetQuantile())))
		}
		return out
	}
	return []labels.Labels{one(name)}
}

// TestProbesAnswerOnARealPeer: every probe of the chart's DaemonSet passes
// on a running peer: an HTTP probe gets 200 from the metrics listener at
// its path, an exec probe exits 0 (its --socket pointed at the peer's).
func TestProbesAnswerOnARealPeer(t *testing.T) {
	_, _, c := renderDecode(t, "")
	peer := startPeer(t)
	client := &http.Client{Timeout: 10 * time.Second}
	for name, p := range map[string]*corev1.Probe{"startup": c.StartupProbe, "liveness": c.LivenessProbe, "readiness": c.ReadinessProbe} {
		if p == nil {
			t.Errorf("no %s probe", name)
			continue
		}
		if p.Exec != nil {
			runExecProbe(t, name, p.Exec.Command, peer.Socket)
			continue
		}
		if p.HTTPGet == nil {
			t.Errorf("%s probe is neither HTTP nor exec", name)
			continue
		}
		resp, err := client.Get("http://" + peer.Metrics + p.HTTPGet.Path)
		if err != nil {
			t.Fatalf("%s probe: %v", name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("%s probe: GET %s answered %s", name, p.HTTPGet.Path, resp.Status)
		}
	}
}

// runExecProbe runs an exec probe's command with the binary under test and
// the test peer's socket.
func runExecProbe(t *testing.T, name string, argv []string, socket string) {
	t.Helper()
	if len(argv) == 0 || argv[0] != "/usr/local/bin/orbitkv" {
		t.Fatalf("%s probe runs %q, want /usr/local/bin/orbitkv", name, argv)
	}
	args := slices.Clone(argv[1:])
	for i, a := range args {
		if strings.HasPrefix(a, "--socket=") {
			args[i] = "--socket=" + socket
		}
	}
	if out, err := exec.Command(binPath, args...).CombinedOutput(); err != nil {
		t.Errorf("%s probe: orbitkv %s: %v\n%s", name, strings.Join(args, " "), err, out)
	}
}
