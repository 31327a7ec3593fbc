package serving

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"time"
)

// Options are the driver's I/O, not part of the measured config.
type Options struct {
	Progress    io.Writer // nil: no progress
	ProgressTTY bool      // redraw a bar instead of printing lines
}

// runner holds one run's I/O.
type runner struct {
	cfg    Config
	opt    Options
	client *Client
	hc     *http.Client
	rows   *rowWriter
	start  time.Time // window start
	refs   map[int]string
	notes  []string
	fails  []string // reasons the run failed outside requests
	peer   *Window
	engine *Window
}

// Run executes cfg, writing the run directory; it returns the summary and a
// non-nil error when the run failed (the directory still says why).
func Run(ctx context.Context, cfg Config, m Manifest, opt Options) (Summary, error) {
	if err := cfg.Validate(); err != nil {
		return Summary{}, err
	}
	if err := prepareDir(cfg.Output); err != nil {
		return Summary{}, err
	}
	m.RunID, m.Config, m.Workload, m.Start, m.Host = newRunID(), cfg, cfg.Workload, time.Now().UTC(), host()
	m.Endpoint, m.Model, m.PeerMetrics, m.EngineMetrics = cfg.Endpoint, cfg.Model, cfg.PeerMetrics, cfg.EngineMetrics
	if err := writeJSON(cfg.Output, ManifestFile, m); err != nil {
		return Summary{}, err
	}
	rows, err := newRowWriter(filepath.Join(cfg.Output, RequestsFile))
	if err != nil {
		return Summary{}, err
	}
	hc := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: cfg.Concurrency + 4}}
	defer hc.CloseIdleConnections()
	r := &runner{cfg: cfg, opt: opt, hc: hc, rows: rows,
		client: &Client{Endpoint: cfg.Endpoint, API: cfg.API, Model: cfg.Model, IgnoreEOS: cfg.IgnoreEOS, HTTP: hc}}
	var w windowResult
	switch cfg.Workload {
	case WorkloadSustained:
		w = r.runSustained(ctx)
	case WorkloadTrace:
		w = r.runTrace(ctx)
	case WorkloadProbes:
		w = r.runProbes(ctx)
	}
	if err := rows.close(); err != nil {
		r.fails = append(r.fails, "write requests.jsonl: "+err.Error())
	}
	if ctx.Err() != nil {
		r.fails = append(r.fails, "interrupted: "+context.Cause(ctx).Error())
	}
	drain := r.finishObservation()
	sum := r.summarize(rows.rows(), w, drain)
	m.End = time.Now().UTC()
	for _, e := range []error{writeJSON(cfg.Output, ManifestFile, m), writeJSON(cfg.Output, SummaryFile, sum)} {
		if e != nil {
			return sum, e
		}
	}
	if sum.Status != "ok" {
		return sum, fmt.Errorf("run %s failed: %s", cfg.Output, strings.Join(sum.Reasons, "; "))
	}
	return sum, nil
}

// prepareDir creates dir; one that already holds a run is refused.
func prepareDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("create output: %w", err)
	}
	for _, f := range []string{ManifestFile, RequestsFile, SummaryFile} {
		if _, err := os.Stat(filepath.Join(dir, f)); err == nil {
			return fmt.Errorf("--output %s already holds a run (%s); use a new directory", dir, f)
		}
	}
	return nil
}

func newRunID() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func host() Host {
	h := Host{GOOS: runtime.GOOS, GOARCH: runtime.GOARCH, CPUs: runtime.NumCPU(), GoVersion: runtime.Version()}
	h.Hostname, _ = os.Hostname()
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		h.Kernel = strings.TrimSpace(string(b))
	}
	return h
}

// windowResult is what the dispatcher saw.
type windowResult struct {
	submitted int
	admitted  time.Time // last admission
	last      time.Time // last completion
	restart   *restartSpan
}

// restartSpan is when a sustained window's engine restart (--restart-at)
// began (in-flight requests drained) and when the engine answered again.
type restartSpan struct {
	drained, ready time.Time
	err            error
}

// window dispatches items until the admission window closes, items run out
// (item returns false) or MaxRequests is reached, keeping at most
// Concurrency requests in flight; then it waits for every one (drain).
// Items with ArrivalMS wait for their arrival time (open loop); others are
// sent as soon as a slot frees (closed loop).
func (r *runner) window(ctx context.Context, phase string, item func(i int) (Item, bool)) windowResult {
	r.start = time.Now()
	admitEnd := r.start.Add(time.Duration(r.cfg.Duration))
	pr := startProgress(r.opt.Progress, r.opt.ProgressTTY, phase, time.Duration(r.cfg.Duration))
	stopSampling := r.sample(ctx)
	admitCtx, cancel := context.WithDeadline(ctx, admitEnd)
	defer cancel()
	sem := make(chan struct{}, r.cfg.Concurrency)
	var wg sync.WaitGroup
	var mu sync.Mutex
	res := windowResult{}
	restartAt := time.Duration(r.cfg.RestartAt)
	for i := 0; r.cfg.MaxRequests == 0 || i < r.cfg.MaxRequests; i++ {
		if restartAt > 0 && res.restart == nil && time.Since(r.start) >= restartAt {
			wg.Wait() // the engine goes down with nothing in flight: no request fails for it
			res.restart = &restartSpan{drained: time.Now()}
			res.restart.err = r.restart(ctx)
			res.restart.ready = time.Now()
			if res.restart.err != nil {
				r.fails = append(r.fails, res.restart.err.Error())
				break
			}
			// the window's admission time after the restart is what was left of it before
			admitEnd = admitEnd.Add(res.restart.ready.Sub(res.restart.drained))
			var cancelAfter context.CancelFunc
			admitCtx, cancelAfter = context.WithDeadline(ctx, admitEnd)
			defer cancelAfter() // once: a window restarts its engine at most once
		}
		it, ok := item(i)
		if !ok || !sleepUntil(admitCtx, r.start.Add(time.Duration(it.ArrivalMS)*time.Millisecond)) {
			break
		}
		select {
		case sem <- struct{}{}:
		case <-admitCtx.Done():
		}
		if admitCtx.Err() != nil {
			break
		}
		res.submitted++
		res.admitted = time.Now()
		pr.inflight.Add(1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			row := r.do(ctx, it, r.start.Add(time.Duration(it.ArrivalMS)*time.Millisecond))
			pr.inflight.Add(-1)
			if row.Error != "" {
				pr.failed.Add(1)
			} else {
				pr.done.Add(1)
			}
			mu.Lock()
			if end := r.start.Add(time.Duration((row.StartS*1e3 + row.LatencyMS) * float64(time.Millisecond))); end.After(res.last) {
				res.last = end
			}
			mu.Unlock()
		}()
	}
	wg.Wait()
	pr.stop()
	stopSampling()
	return res
}

// sleepUntil waits for t; false if ctx ended first.
func sleepUntil(ctx context.Context, t time.Time) bool {
	d := time.Until(t)
	if d <= 0 {
		return ctx.Err() == nil
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
		return true
	case <-ctx.Done():
		return false
	}
}

// do sends one item under the request deadline and records its row.
func (r *runner) do(ctx context.Context, it Item, arrival time.Time) Row {
	rctx, cancel := context.WithTimeout(ctx, time.Duration(r.cfg.RequestTimeout))
	defer cancel()
	res := r.client.Complete(rctx, it.Prompt, it.MaxTokens)
	row := Row{Index: it.Index, Phase: it.Phase, PrefixID: it.PrefixID, Reuse: it.Reuse,
		PromptTokens: len(it.Prompt), MaxTokens: it.MaxTokens, OutputText: res.Text,
		OutputChunks: res.Chunks, CompletionTokens: res.CompletionTokens,
		CachedTokens: res.CachedTokens, RestoredTokens: res.RestoredTokens,
		StartS: res.Start.Sub(r.start).Seconds(), TTFTMS: ms(res.TTFT), LatencyMS: ms(res.Latency),
		ITLMS: make([]float64, len(res.ITL))}
	if it.ArrivalMS > 0 {
		row.QueueMS = ms(res.Start.Sub(arrival))
	}
	for i, d := range res.ITL {
		row.ITLMS[i] = ms(d)
	}
	switch {
	case res.Err != nil && errors.Is(res.Err, context.DeadlineExceeded) && ctx.Err() == nil:
		row.Error = fmt.Sprintf("deadline: no complete answer within %s (%v)", time.Duration(r.cfg.RequestTimeout), res.Err)
	case res.Err != nil:
		row.Error = res.Err.Error()
	case res.Chunks == 0:
		row.Error = "stream had no text"
	}
	if ref, ok := r.refs[it.PrefixID]; ok && it.Reuse && row.Error == "" {
		match := ref == res.Text
		row.MatchReference = &match
	}
	r.rows.add(row)
	return row
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
