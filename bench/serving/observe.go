package serving

import (
	"context"
	"fmt"
	"sync"
	"time"
)

const scrapeTimeout = 10 * time.Second

// beginObservation scrapes the peer (and engine) before the window.
func (r *runner) beginObservation(ctx context.Context) {
	for _, ep := range []struct {
		url string
		w   **Window
	}{{r.cfg.PeerMetrics, &r.peer}, {r.cfg.EngineMetrics, &r.engine}} {
		if ep.url == "" {
			continue
		}
		w := &Window{URL: ep.url}
		sctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
		s, err := Scrape(sctx, r.hc, ep.url)
		cancel()
		if err != nil {
			w.Error = "before: " + err.Error()
		}
		w.Before = s
		w.observe(s)
		*ep.w = w
	}
	if r.peer != nil && r.peer.Error != "" {
		r.fails = append(r.fails, "peer metrics: "+r.peer.Error)
	}
}

// sample records gauge peaks of the peer every SampleEvery until stopped.
func (r *runner) sample(ctx context.Context) (stop func()) {
	if r.peer == nil {
		return func() {}
	}
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t := time.NewTicker(time.Duration(r.cfg.SampleEvery))
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-ctx.Done():
				return
			case <-t.C:
				sctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
				s, err := Scrape(sctx, r.hc, r.peer.URL)
				cancel()
				if err == nil {
					r.peer.observe(s) // only this goroutine touches Peak during the window
				}
			}
		}
	}()
	return func() { close(done); wg.Wait() }
}

// finishObservation scrapes after the window, waits for the peer to drain,
// and writes metrics.json and drain.json.
func (r *runner) finishObservation() Drain {
	ctx := context.Background() // the window may have been interrupted; these scrapes have deadlines
	windows := map[string]*Window{}
	for name, w := range map[string]*Window{"peer": r.peer, "engine": r.engine} {
		if w == nil {
			continue
		}
		sctx, cancel := context.WithTimeout(ctx, scrapeTimeout)
		s, err := Scrape(sctx, r.hc, w.URL)
		cancel()
		if err != nil && w.Error == "" {
			w.Error = "after: " + err.Error()
		}
		w.After = s
		w.observe(s)
		w.Deltas()
		windows[name] = w
	}
	drain := Drain{Note: "no --peer-metrics: nothing to drain"}
	if r.peer != nil {
		if r.peer.Error != "" {
			r.fails = append(r.fails, "peer metrics: "+r.peer.Error)
		}
		drain = WaitDrain(ctx, r.hc, r.peer.URL, time.Duration(r.cfg.DrainTimeout), 200*time.Millisecond)
	}
	if err := writeJSON(r.cfg.Output, MetricsFile, windows); err != nil {
		r.fails = append(r.fails, err.Error())
	}
	if err := writeJSON(r.cfg.Output, DrainFile, drain); err != nil {
		r.fails = append(r.fails, err.Error())
	}
	if drain.Checked && !drain.OK {
		r.fails = append(r.fails, fmt.Sprintf("peer gauges did not drain to 0 within %s: %v", time.Duration(r.cfg.DrainTimeout), drain.Gauges))
	}
	return drain
}
