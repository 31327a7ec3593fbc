package serving

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Sample is one scrape of a Prometheus text endpoint: series → value, and
// metric name → type (counter, gauge, …).
type Sample struct {
	At     time.Time          `json:"at"`
	Values map[string]float64 `json:"values"`
	Types  map[string]string  `json:"types,omitempty"`
	// NotFinite names the series whose value was NaN or ±Inf (allowed in
	// Prometheus' text format, not in JSON): they are left out of Values.
	NotFinite []string `json:"not_finite,omitempty"`
}

// DrainGauges are the peer gauges that must return to 0 when idle (DESIGN.md §7).
var DrainGauges = []string{
	"orbitkv_fabric_leases",
	"orbitkv_fabric_query_bytes",
	"orbitkv_transfer_inflight_ops",
	"orbitkv_transfer_inflight_copies",
	"orbitkv_tiers_ssd_inflight",
}

// Scrape fetches and parses url (a /metrics endpoint) within ctx.
func Scrape(ctx context.Context, hc *http.Client, url string) (Sample, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return Sample{}, err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return Sample{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return Sample{}, fmt.Errorf("scrape %s: HTTP %d", url, resp.StatusCode)
	}
	s, err := ParseMetrics(resp.Body)
	if err != nil {
		return Sample{}, fmt.Errorf("scrape %s: %w", url, err)
	}
	return s, nil
}

// ParseMetrics reads the Prometheus text format. Series keep their label
// text: `name{label="v"}`.
func ParseMetrics(r io.Reader) (Sample, error) {
	s := Sample{At: time.Now(), Values: map[string]float64{}, Types: map[string]string{}}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 4<<20)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" {
			continue
		}
		if rest, ok := strings.CutPrefix(line, "# TYPE "); ok {
			if f := strings.Fields(rest); len(f) == 2 {
				s.Types[f[0]] = f[1]
			}
			continue
		}
		if line[0] == '#' {
			continue
		}
		series, value, ok := splitSeries(line)
		if !ok {
			return s, fmt.Errorf("bad metrics line %.80q", line)
		}
		v, err := strconv.ParseFloat(value, 64)
		if err != nil {
			return s, fmt.Errorf("bad value in metrics line %.80q", line)
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			s.NotFinite = append(s.NotFinite, series)
			continue
		}
		s.Values[series] = v
	}
	return s, sc.Err()
}

// splitSeries splits `name{labels} value [timestamp]`.
func splitSeries(line string) (series, value string, ok bool) {
	end := 0
	if i := strings.IndexByte(line, '}'); i >= 0 {
		end = i + 1
	} else if end = strings.IndexAny(line, " \t"); end < 0 {
		return "", "", false
	}
	f := strings.Fields(line[end:])
	if len(f) == 0 {
		return "", "", false
	}
	return line[:end], f[0], true
}

// metricName is the name part of a series.
func metricName(series string) string {
	name, _, _ := strings.Cut(series, "{")
	return name
}

// Window is what metrics.json holds for one endpoint.
type Window struct {
	URL    string             `json:"url"`
	Before Sample             `json:"before"`
	After  Sample             `json:"after"`
	Delta  map[string]float64 `json:"delta"` // counters: after − before
	Peak   map[string]float64 `json:"peak"`  // gauges: the largest sampled value in the window
	Error  string             `json:"error,omitempty"`
}

// Deltas fills Delta from Before/After for counters (and untyped *_total).
func (w *Window) Deltas() {
	w.Delta = map[string]float64{}
	for k, a := range w.After.Values {
		name := metricName(k)
		t := w.After.Types[name]
		if t == "" {
			t = w.After.Types[strings.TrimSuffix(name, "_total")]
		}
		if t != "counter" && !strings.HasSuffix(name, "_total") {
			continue
		}
		if slices.Contains(w.Before.NotFinite, k) {
			continue // no number before: no delta to tell
		}
		w.Delta[k] = a - w.Before.Values[k]
	}
}

// observe raises Peak with a sample's gauges.
func (w *Window) observe(s Sample) {
	if w.Peak == nil {
		w.Peak = map[string]float64{}
	}
	for k, v := range s.Values {
		if s.Types[metricName(k)] != "gauge" {
			continue
		}
		if p, ok := w.Peak[k]; !ok || v > p {
			w.Peak[k] = v
		}
	}
}

// Drain is drain.json: whether the peer's gauges returned to 0 after the run.
type Drain struct {
	Checked  bool               `json:"checked"` // false: no --peer-metrics
	OK       bool               `json:"ok"`
	WaitedS  float64            `json:"waited_s"`
	TimeoutS float64            `json:"timeout_s"`
	Gauges   map[string]float64 `json:"gauges,omitempty"` // last values seen
	Error    string             `json:"error,omitempty"`
	Note     string             `json:"note,omitempty"`
}

// WaitDrain polls url until every DrainGauges series is 0 or timeout passes.
// A gauge the endpoint does not export counts as 0 (e.g. no SSD tier).
func WaitDrain(ctx context.Context, hc *http.Client, url string, timeout, every time.Duration) Drain {
	d := Drain{Checked: true, TimeoutS: timeout.Seconds()}
	start := time.Now()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	tick := time.NewTicker(every)
	defer tick.Stop()
	for {
		s, err := Scrape(ctx, hc, url)
		if err == nil {
			d.Gauges, d.Error = map[string]float64{}, ""
			busy := false
			for k, v := range s.Values {
				for _, g := range DrainGauges {
					if metricName(k) == g {
						d.Gauges[k] = v
						busy = busy || v != 0
					}
				}
			}
			if !busy {
				d.OK, d.WaitedS = true, time.Since(start).Seconds()
				return d
			}
		} else {
			d.Error = err.Error()
		}
		select {
		case <-ctx.Done():
			d.WaitedS = time.Since(start).Seconds()
			d.Note = fmt.Sprintf("gauges still busy after %s", timeout)
			return d
		case <-tick.C:
		}
	}
}
