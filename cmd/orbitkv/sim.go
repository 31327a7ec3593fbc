package main

import (
	"compress/gzip"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/orbitkv/orbitkv/bench/sim"
	"github.com/orbitkv/orbitkv/internal/bytesize"
)

// runSim replays a Mooncake-format trace against the catalog and the tier
// eviction code in virtual time (package bench/sim) and prints what it hit,
// moved and saved.
func runSim(_ context.Context, args []string, out io.Writer) error {
	cfg := sim.DefaultConfig()
	fs := flag.NewFlagSet("sim", flag.ContinueOnError)
	trace := fs.String("trace", "", "trace file: JSONL of {timestamp ms, input_length, output_length, hash_ids} (required)")
	fs.IntVar(&cfg.Hosts, "hosts", cfg.Hosts, "engine hosts, one peer each")
	fs.BoolVar(&cfg.Sharing, "sharing", false, "extend a host's hit with pages held by other hosts (remote fetch)")
	router := fs.String("router", string(cfg.Router), "request routing: "+routerNames())
	model := fs.String("model", cfg.Model.Name, "KV geometry: "+strings.Join(sim.ModelNames(), ", "))
	fs.IntVar(&cfg.PageTokens, "page-tokens", cfg.PageTokens, "tokens per page")
	fs.Int64Var(&cfg.HBMTokens, "hbm-tokens", cfg.HBMTokens, "engine prefix cache per host, tokens (0: none)")
	dramBytes, ssdBytes := bytesize.Size(cfg.DRAMBytes), bytesize.Size(cfg.SSDBytes)
	fs.Var(&dramBytes, "dram-bytes", "DRAM tier per host (0: no offload)")
	fs.Var(&ssdBytes, "ssd-bytes", "SSD tier per host (0: none)")
	fs.BoolVar(&cfg.SSDCut, "ssd-cut", false, "model the peer's restore-or-recompute cut: a lookup stops at the first SSD-only page when reading it is slower than computing it")
	fs.BoolVar(&cfg.NoReadmit, "no-readmit", false, "model the peer before readmission: a computed page held only on SSD is not saved back into DRAM")
	fs.BoolVar(&cfg.ReadmitAll, "readmit-all", false, "model readmission before 2026-12-02: into a full DRAM tier even when the page was asked for no more often lately than the page it pushes out")
	fs.StringVar(&cfg.DRAMPolicy, "dram-policy", cfg.DRAMPolicy, "DRAM eviction order: slru (the peer's: restored pages protected from pages saved once) or lru (one LRU, the order before 2026-12-01)")
	fs.Float64Var(&cfg.Cost.PrefillUsPerToken, "prefill-us-per-token", cfg.Cost.PrefillUsPerToken, "prefill compute per missed token, µs (default: an H200 Qwen3-8B estimate, docs/benchmarks.md)")
	fs.Float64Var(&cfg.Cost.DRAMGBps, "dram-gbps", cfg.Cost.DRAMGBps, "DRAM → HBM bandwidth, GB/s (1e9 bytes/s)")
	fs.Float64Var(&cfg.Cost.SSDGBps, "ssd-gbps", cfg.Cost.SSDGBps, "SSD → HBM bandwidth, GB/s")
	fs.Float64Var(&cfg.Cost.NetGBps, "net-gbps", cfg.Cost.NetGBps, "remote peer → HBM bandwidth, GB/s")
	asJSON := fs.Bool("json", false, "print the result as JSON")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("sim: unexpected argument %q", fs.Arg(0))
	}
	if *trace == "" {
		return errors.New("sim: --trace is required")
	}
	m, ok := sim.Models[*model]
	if !ok {
		return fmt.Errorf("sim: unknown model %q: want one of %s", *model, strings.Join(sim.ModelNames(), ", "))
	}
	cfg.Model, cfg.Router = m, sim.Router(*router)
	cfg.DRAMBytes, cfg.SSDBytes = uint64(dramBytes), uint64(ssdBytes)
	if err := cfg.Validate(); err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	return simulate(out, *trace, cfg, *asJSON)
}

func simulate(out io.Writer, path string, cfg sim.Config, asJSON bool) error {
	start := time.Now()
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") { // internal/trace/testdata carries the synthetic trace gzipped
		zr, err := gzip.NewReader(f)
		if err != nil {
			return fmt.Errorf("sim: %s: %w", path, err)
		}
		r = zr
	}
	reqs, err := sim.ParseTrace(r)
	if err != nil {
		return fmt.Errorf("sim: %s: %w", path, err)
	}
	res, err := sim.Run(cfg, reqs)
	if err != nil {
		return fmt.Errorf("sim: %w", err)
	}
	wall := time.Since(start)
	if asJSON {
		enc := json.NewEncoder(out)
		enc.SetIndent("", "  ")
		return enc.Encode(struct {
			Trace string `json:"trace"`
			*sim.Result
			WallS float64 `json:"wall_s"`
		}{path, res, wall.Seconds()})
	}
	if err := res.WriteTable(out); err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "simulated in %s (wall clock)\n", wall.Round(time.Millisecond))
	return err
}

func routerNames() string {
	names := make([]string, len(sim.Routers))
	for i, r := range sim.Routers {
		names[i] = string(r)
	}
	return strings.Join(names, "|")
}
