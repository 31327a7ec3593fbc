package serving

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// prefixRow is one line of prefixes.jsonl: a prepared prompt and its serial
// reference output.
type prefixRow struct {
	ID        int     `json:"id"`
	Tokens    []int   `json:"tokens"`
	Reference string  `json:"reference"`
	TTFTMS    float64 `json:"ttft_ms"`
	Error     string  `json:"error,omitempty"`
}

// runSustained prepares the prefixes serially (recording each output as the
// reference), then runs the closed-loop window.
func (r *runner) runSustained(ctx context.Context) windowResult {
	w := r.cfg.sustained()
	if err := r.prepare(ctx, w); err != nil {
		r.fails = append(r.fails, err.Error())
		return windowResult{}
	}
	r.beginObservation(ctx)
	return r.window(ctx, "sustained", func(i int) (Item, bool) { return w.Item(i), true })
}

func (r *runner) prepare(ctx context.Context, w Sustained) error {
	f, err := os.Create(filepath.Join(r.cfg.Output, PrefixesFile))
	if err != nil {
		return fmt.Errorf("create prefixes: %w", err)
	}
	defer f.Close()
	enc := json.NewEncoder(f)
	r.refs = map[int]string{}
	for j := range w.Prefixes {
		if r.opt.Progress != nil && (j == 0 || r.opt.ProgressTTY) {
			fmt.Fprintf(r.opt.Progress, "\rbench serving: preparing prefix %d/%d", j+1, w.Prefixes)
		}
		rctx, cancel := context.WithTimeout(ctx, time.Duration(r.cfg.RequestTimeout))
		tokens := w.Prefix(j)
		res := r.client.Complete(rctx, tokens, w.OutputTokens)
		cancel()
		row := prefixRow{ID: j, Tokens: tokens, Reference: res.Text, TTFTMS: ms(res.TTFT)}
		if res.Err != nil {
			row.Error = res.Err.Error()
		}
		if err := enc.Encode(row); err != nil {
			return fmt.Errorf("write prefixes: %w", err)
		}
		if res.Err != nil {
			return fmt.Errorf("prepare prefix %d (%d tokens): %w", j, len(tokens), res.Err)
		}
		r.refs[j] = res.Text
	}
	if r.opt.Progress != nil {
		fmt.Fprintln(r.opt.Progress)
	}
	return nil
}

// runTrace replays the trace at its (scaled) arrival times.
func (r *runner) runTrace(ctx context.Context) windowResult {
	recs, err := ReadTraceFile(r.cfg.TracePath)
	if err != nil {
		r.fails = append(r.fails, err.Error())
		return windowResult{}
	}
	t := Trace{Records: recs, Seed: r.cfg.Seed, Vocab: r.cfg.Vocab, TimeScale: r.cfg.TimeScale,
		MaxInput: r.cfg.MaxInput, OutputTokens: r.cfg.OutputTokens}
	r.beginObservation(ctx)
	return r.window(ctx, "trace", func(i int) (Item, bool) {
		if i >= len(recs) {
			return Item{}, false
		}
		return t.Item(i), true
	})
}

// Probe phases, in the order they run for each fresh prompt.
const (
	PhaseCold     = "cold"     // never seen
	PhaseResident = "resident" // sent again at once: in the engine's own cache
	PhaseFiller   = "filler"   // prompts that overflow the engine's KV pool
	PhaseEvicted  = "evicted"  // after the fillers: restored (OrbitKV) or recomputed
	PhaseRestart  = "restart"  // after an engine restart
)

const streamProbe = 0x50524f42 << 32 // "PROB"

// runProbes measures one prompt length cold, resident, evicted and after a
// restart, ProbeReps times with fresh prompts. Requests run one at a time.
func (r *runner) runProbes(ctx context.Context) windowResult {
	r.beginObservation(ctx)
	r.start = time.Now()
	stopSampling := r.sample(ctx)
	defer stopSampling()
	res := windowResult{}
	r.refs = map[int]string{}
	if r.cfg.RestartCmd == "" {
		r.notes = append(r.notes, "restart probe skipped: no --restart-cmd")
	}
	idx := 0
	send := func(it Item) Row {
		it.Index, it.MaxTokens = idx, r.cfg.OutputTokens
		idx++
		res.submitted++
		res.admitted = time.Now()
		row := r.do(ctx, it, time.Time{})
		res.last = time.Now()
		return row
	}
	for rep := range r.cfg.ProbeReps {
		prompt := randomTokens(rng(r.cfg.Seed, streamProbe|uint64(rep)), r.cfg.ProbeTokens, r.cfg.Vocab)
		cold := send(Item{PrefixID: rep, Prompt: prompt, Phase: PhaseCold})
		if cold.Error != "" || ctx.Err() != nil {
			return res
		}
		r.refs[rep] = cold.OutputText
		send(Item{PrefixID: rep, Reuse: true, Prompt: prompt, Phase: PhaseResident})
		for n, f := 0, 0; n < r.cfg.FillerTokens && ctx.Err() == nil; f++ {
			l := min(r.cfg.ProbeTokens, r.cfg.FillerTokens-n)
			filler := randomTokens(rng(r.cfg.Seed, streamProbe|1<<24|uint64(rep)<<12|uint64(f)), l, r.cfg.Vocab)
			send(Item{PrefixID: -1, Prompt: filler, Phase: PhaseFiller})
			n += l
		}
		send(Item{PrefixID: rep, Reuse: true, Prompt: prompt, Phase: PhaseEvicted})
		if r.cfg.RestartCmd != "" {
			if err := r.restart(ctx); err != nil {
				r.fails = append(r.fails, err.Error())
				return res
			}
			send(Item{PrefixID: rep, Reuse: true, Prompt: prompt, Phase: PhaseRestart})
		}
	}
	return res
}

// restart runs RestartCmd and waits until the endpoint answers again, all
// within RestartTimeout.
func (r *runner) restart(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Duration(r.cfg.RestartTimeout))
	defer cancel()
	cmd := exec.CommandContext(ctx, "sh", "-c", r.cfg.RestartCmd)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		return fmt.Errorf("--restart-cmd: %w", err)
	}
	url := strings.TrimSuffix(strings.TrimRight(r.cfg.Endpoint, "/"), "/v1") + "/v1/models"
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if resp, err := r.hc.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !sleepUntil(ctx, time.Now().Add(200*time.Millisecond)) {
			return fmt.Errorf("engine not ready within %s of --restart-cmd", time.Duration(r.cfg.RestartTimeout))
		}
	}
}
