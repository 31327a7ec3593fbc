package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
)

// The catalog's cost curve (`orbitkv bench cluster --scale`): real
// memberlist instances on loopback, in this one process, each a full
// fabric/cluster member with its own in-memory catalog, as hosts and pages
// per host grow. Per point it measures the remote index's memory per peer,
// gossip bytes per second per peer (idle, and with page churn), how long an
// announcement takes to reach every member, and lookup p99 (a local hit,
// and a chain held on another member). A model fitted to the points
// extrapolates to sizes this machine cannot run.

// ScaleConfig is a cost-curve run.
type ScaleConfig struct {
	Hosts      []int         // cluster sizes measured
	Pages      []int         // pages per host measured
	MaxEntries int           // a point is skipped when hosts×(hosts−1)×pages remote entries exceed this (memory)
	Churn      int           // page changes per second per host while churn gossip is measured (half saves, half drops)
	Window     time.Duration // how long idle and churning gossip are each measured
	Probes     int           // single-page announcements timed until every member has them
	Lookups    int           // lookups timed per kind
	Chain      int           // pages per lookup chain
	Timeout    time.Duration // a point's cluster must form and converge by then
	Compact    bool          // members publish compact summaries (fabric/cluster Config.CompactCatalog)
	// HeapProfile, when set, is where each point's heap profile goes
	// (PATH.HOSTSxPAGES), taken when the remote index is measured.
	HeapProfile string
	// The model's point: hosts, pages per host, churn (changes/s/host).
	ModelHosts, ModelPages, ModelChurn int
}

// DefaultScaleConfig is `bench cluster --scale`'s default run.
func DefaultScaleConfig() ScaleConfig {
	return ScaleConfig{Hosts: []int{10, 30, 100}, Pages: []int{10_000, 100_000}, MaxEntries: 12_000_000,
		Churn: 20, Window: 3 * time.Second, Probes: 20, Lookups: 2000, Chain: 32, Timeout: 3 * time.Minute,
		ModelHosts: 1000, ModelPages: 100_000, ModelChurn: 100}
}

// Validate checks c.
func (c ScaleConfig) Validate() error {
	if len(c.Hosts) == 0 || len(c.Pages) == 0 {
		return errors.New("bench cluster --scale: --scale-hosts and --scale-pages need at least one value each")
	}
	for _, n := range c.Hosts {
		if n < 2 || n > catalog.MaxOrigins {
			return fmt.Errorf("bench cluster --scale: %d hosts: must be 2..%d (catalog.MaxOrigins)", n, catalog.MaxOrigins)
		}
	}
	for _, p := range c.Pages {
		if p < c.Chain || p <= 0 {
			return fmt.Errorf("bench cluster --scale: %d pages per host: must be at least the chain (%d)", p, c.Chain)
		}
	}
	if c.Churn < 2 || c.Window <= 0 || c.Probes <= 0 || c.Lookups <= 0 || c.Chain <= 0 || c.Timeout <= 0 || c.MaxEntries <= 0 {
		return errors.New("bench cluster --scale: churn (≥2), window, probes, lookups, chain, timeout and max entries must be positive")
	}
	if c.ModelHosts < 2 || c.ModelPages <= 0 || c.ModelChurn <= 0 {
		return errors.New("bench cluster --scale: the model's hosts (≥2), pages and churn must be positive")
	}
	return nil
}

// ParseInts parses a comma-separated list of positive integers (1e4 and
// 10_000 forms allowed).
func ParseInts(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.ReplaceAll(strings.TrimSpace(f), "_", "")
		if f == "" {
			continue
		}
		v, err := strconv.ParseFloat(f, 64)
		if err != nil || v < 1 || v != float64(int(v)) {
			return nil, fmt.Errorf("%q is not a positive integer", f)
		}
		out = append(out, int(v))
	}
	return out, nil
}

// RunScale measures every point of cfg that fits and prints the curve,
// measured beside the fitted model, and the model at cfg's model point.
func RunScale(ctx context.Context, cfg ScaleConfig, out io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	sink := installGossipCounter()
	design := "exact index (every page announced to every member)"
	if cfg.Compact {
		design = "compact catalog (a filter per member, claims confirmed by Holds)"
	}
	fmt.Fprintf(out, "catalog cost curve: %s; %d cores; churn %d changes/s/host, window %v\n", design, runtime.GOMAXPROCS(0), cfg.Churn, cfg.Window)
	var pts []scalePoint
	for _, p := range cfg.Pages {
		for _, n := range cfg.Hosts {
			if n*(n-1)*p > cfg.MaxEntries {
				fmt.Fprintf(out, "skip %d hosts × %d pages: %d remote entries in this process (over --scale-max-entries %d)\n", n, p, n*(n-1)*p, cfg.MaxEntries)
				continue
			}
			pt, err := measurePoint(ctx, cfg, sink, n, p)
			if err != nil {
				return fmt.Errorf("%d hosts × %d pages: %w", n, p, err)
			}
			pts = append(pts, pt)
			fmt.Fprintf(out, "measured %s\n", pt)
		}
	}
	if len(pts) == 0 {
		return errors.New("bench cluster --scale: no point fits --scale-max-entries")
	}
	m := fitModel(pts)
	printCurve(out, cfg, pts, m)
	return nil
}

// RegisterFlags binds the --scale-* flags to c.
func (c *ScaleConfig) RegisterFlags(fs *flag.FlagSet) {
	ints := func(dst *[]int) func(string) error {
		return func(s string) (err error) { *dst, err = ParseInts(s); return err }
	}
	fs.Func("scale-hosts", "cluster sizes measured, comma-separated (default 10,30,100)", ints(&c.Hosts))
	fs.Func("scale-pages", "pages per host measured, comma-separated (default 1e4,1e5)", ints(&c.Pages))
	fs.IntVar(&c.MaxEntries, "scale-max-entries", c.MaxEntries, "skip points with more remote entries than this in all (hosts×(hosts−1)×pages: memory)")
	fs.IntVar(&c.Churn, "scale-churn", c.Churn, "page changes per second per host while gossip is measured")
	fs.DurationVar(&c.Window, "scale-window", c.Window, "how long idle and churning gossip are each measured")
	fs.IntVar(&c.Probes, "scale-probes", c.Probes, "announcements timed until every member has them")
	fs.IntVar(&c.Lookups, "scale-lookups", c.Lookups, "lookups timed per kind")
	fs.DurationVar(&c.Timeout, "scale-timeout", c.Timeout, "a point's cluster must form and converge by then")
	fs.StringVar(&c.HeapProfile, "scale-heap-profile", c.HeapProfile, "write each point's heap profile to PATH.HOSTSxPAGES when its index is measured")
	fs.BoolVar(&c.Compact, "scale-compact", c.Compact, "members publish compact summaries (--cluster-compact-catalog)")
	fs.IntVar(&c.ModelHosts, "model-hosts", c.ModelHosts, "the model's cluster size")
	fs.IntVar(&c.ModelPages, "model-pages", c.ModelPages, "the model's pages per host")
	fs.IntVar(&c.ModelChurn, "model-churn", c.ModelChurn, "the model's page changes per second per host")
}
