package main

import (
	"context"
	"flag"
	"fmt"
	"io"
	"os"

	"github.com/orbitkv/orbitkv/bench/serving"
)

func runBenchServing(ctx context.Context, args []string, out io.Writer) error {
	const usage = `usage: orbitkv bench serving --endpoint URL --output DIR [flags]

Drives an OpenAI-compatible /v1/completions endpoint with streaming and writes
a run directory (manifest.json, requests.jsonl, metrics.json, drain.json,
summary.json) for 'orbitkv bench report'. Workloads:

  sustained  N prepared prefixes, each sent once serially first (its output is
             the reference); then a closed loop of --concurrency clients for
             --duration, each request reusing a prefix with probability
             --reuse or sending a new random prompt; then a drain.
  trace      replay a Mooncake FAST'25 JSONL trace (--trace PATH) at its
             arrival times x --time-scale; block tokens from hash ids (the
             parser of 'orbitkv sim': float timestamps, extra fields ok).
  probes     one prompt length (--probe-tokens): cold, resident (sent twice),
             evicted (after --filler-tokens of other prompts), restart
             (after --restart-cmd; skipped with a note if unset).

Example (reference engine on CPU, one process pair of docs/benchmarks.md):
  orbitkv bench serving --endpoint http://127.0.0.1:8000 --vocab 512 \
    --prefix-tokens 512,1024,2048 --duration 20s \
    --peer-metrics http://127.0.0.1:9464/metrics \
    --label config=orbitkv --label pair=1 --label order=AB --output runs/orbitkv-1

flags:
`
	cfg := serving.DefaultConfig()
	fs := flag.NewFlagSet("bench serving", flag.ContinueOnError)
	fs.Usage = func() { fmt.Fprint(fs.Output(), usage); fs.PrintDefaults() }
	labels := labelFlag{}
	quiet := fs.Bool("quiet", false, "no progress on stderr")
	deterministic := fs.Bool("deterministic", true, "the engine is batch invariant, so every reused prompt must match its serial reference; "+
		"--deterministic=false labels the run non-deterministic in its manifest: bench report then accepts its mismatches and says so at the top")
	registerServingFlags(fs, &cfg, labels)
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("bench serving: unexpected argument %q (flags only)", fs.Arg(0))
	}
	if !*deterministic && cfg.RequireMatch {
		return fmt.Errorf("bench serving: --require-match contradicts --deterministic=false")
	}
	m := serving.Manifest{Command: append([]string{"orbitkv", "bench", "serving"}, args...),
		Version: version(), Labels: labels, Deterministic: deterministic}
	m.GitRevision, m.GitDirty = serving.GitRevision(ctx)
	opt := serving.Options{}
	if !*quiet {
		opt.Progress, opt.ProgressTTY = os.Stderr, serving.IsTerminal(os.Stderr)
	}
	sum, err := serving.Run(ctx, cfg, m, opt)
	if sum.Status != "" {
		serving.PrintSummary(out, cfg, sum)
	}
	return err
}

func registerServingFlags(fs *flag.FlagSet, c *serving.Config, labels labelFlag) {
	fs.StringVar(&c.Endpoint, "endpoint", c.Endpoint, "base URL of the engine's HTTP server")
	fs.StringVar(&c.API, "api", c.API, "openai: streamed /v1/completions (vLLM, the reference engine); "+
		"sglang: SGLang's native /generate with input_ids, for a server started with --skip-tokenizer-init")
	fs.StringVar(&c.Model, "model", c.Model, "model name sent in each request (empty: left out)")
	fs.StringVar(&c.Workload, "workload", c.Workload, "sustained | trace | probes")
	fs.StringVar(&c.Output, "output", c.Output, "run directory to create (required; must not hold a run)")
	fs.Uint64Var(&c.Seed, "seed", c.Seed, "seed of prompts and the request sequence")
	fs.IntVar(&c.Vocab, "vocab", c.Vocab, "token ids are drawn from [0, vocab) (reference engine tiny: 512)")
	fs.IntVar(&c.Concurrency, "concurrency", c.Concurrency, "requests in flight at most (closed loop)")
	fs.Var((*durationFlag)(&c.Duration), "duration", "admission window; all admitted requests then complete")
	fs.IntVar(&c.MaxRequests, "max-requests", c.MaxRequests, "stop admitting after this many requests (0: no limit)")
	fs.IntVar(&c.OutputTokens, "output-tokens", c.OutputTokens, "output tokens per request (trace: cap on output_length, 0 = trace's own)")
	fs.Var((*durationFlag)(&c.RequestTimeout), "request-timeout", "deadline of one request")
	fs.BoolVar(&c.IgnoreEOS, "ignore-eos", c.IgnoreEOS, "send ignore_eos so every request generates --output-tokens")
	fs.IntVar(&c.Prefixes, "prefixes", c.Prefixes, "sustained: prepared prefixes")
	fs.Var((*intsFlag)(&c.PrefixTokens), "prefix-tokens", "sustained: comma-separated prefix lengths, cycled (CPU: 128,256,512)")
	fs.Float64Var(&c.Reuse, "reuse", c.Reuse, "sustained: probability that a request reuses a prepared prefix")
	fs.StringVar(&c.TracePath, "trace", c.TracePath, "trace: Mooncake-format JSONL file")
	fs.Float64Var(&c.TimeScale, "time-scale", c.TimeScale, "trace: multiplies arrival offsets (0.1 = 10x faster)")
	fs.IntVar(&c.MaxInput, "max-input", c.MaxInput, "trace: truncate prompts to this many tokens (0: no limit)")
	fs.IntVar(&c.ProbeTokens, "probe-tokens", c.ProbeTokens, "probes: prompt length")
	fs.IntVar(&c.ProbeReps, "probe-reps", c.ProbeReps, "probes: fresh prompts, each measured in every phase")
	fs.IntVar(&c.FillerTokens, "filler-tokens", c.FillerTokens, "probes: tokens of other prompts sent to evict the probe (> engine KV pool)")
	fs.StringVar(&c.RestartCmd, "restart-cmd", c.RestartCmd, "probes, and sustained with --restart-at: shell command that restarts the engine (probes without it: restart probe skipped)")
	fs.Var((*durationFlag)(&c.RestartTimeout), "restart-timeout", "deadline of --restart-cmd plus readiness")
	fs.Var((*durationFlag)(&c.RestartAt), "restart-at", "sustained: this far into the window, drain, run --restart-cmd, wait for the engine and go on; summary.json's restart says how long the rate took to come back (0: never)")
	fs.StringVar(&c.PeerMetrics, "peer-metrics", c.PeerMetrics, "OrbitKV peer /metrics URL: window deltas, gauge peaks, drain check")
	fs.StringVar(&c.EngineMetrics, "engine-metrics", c.EngineMetrics, "engine /metrics URL (optional): window deltas")
	fs.Var((*durationFlag)(&c.DrainTimeout), "drain-timeout", "post-run wait for the peer's gauges to reach 0")
	fs.Var((*durationFlag)(&c.SampleEvery), "sample-every", "peer gauge sampling period during the window")
	fs.BoolVar(&c.RequireMatch, "require-match", c.RequireMatch, "fail the run when a reused prompt's output differs from its reference")
	fs.Var(labels, "label", "KEY=VALUE recorded in the manifest (repeatable); bench report uses config=, pair=, order=")
}
