package deploy

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/prometheus/prometheus/model/labels"
)

// startPeer runs `orbitkv serve` on a fresh data dir with a small DRAM pool,
// in a standalone cluster of one, every port chosen by the kernel, and
// returns its metrics address once it logs "serving".
func startPeer(t *testing.T) string {
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
	serving := make(chan string, 1)
	go scanServing(stderr, serving)
	select {
	case addr := <-serving:
		return addr
	case err := <-exited:
		t.Fatalf("peer exited before serving: %v", err)
	case <-time.After(60 * time.Second):
		t.Fatal("peer did not log serving within 60 s")
	}
	return ""
}

// scanServing sends the metrics address of the first "serving" line, then
// drains the log.
func scanServing(r io.Reader, serving chan<- string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	sent := false
	for sc.Scan() {
		var line struct{ Message, Metrics string }
		if !sent && json.Unmarshal(sc.Bytes(), &line) == nil && line.Message == "serving" {
			serving <- line.Metrics
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
