package sim

import (
	"errors"
	"fmt"
	"slices"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers"
)

// Config is one simulated cluster. Capacities are per host.
type Config struct {
	Hosts   int    `json:"hosts"`   // engine hosts, one peer each
	Sharing bool   `json:"sharing"` // lookups extend the local hit with other hosts' pages
	Router  Router `json:"router"`  // which host serves a request

	Model      Model `json:"model"`       // KV geometry: page bytes and the layout fingerprint
	PageTokens int   `json:"page_tokens"` // tokens per page

	HBMTokens int64  `json:"hbm_tokens"` // engine prefix cache per host, tokens (0: none)
	DRAMBytes uint64 `json:"dram_bytes"` // peer DRAM tier per host, bytes (0: no offload at all)
	SSDBytes  uint64 `json:"ssd_bytes"`  // peer SSD tier per host, bytes (0: no SSD tier)
	// DRAMPolicy is the DRAM tier's eviction order: DRAMSegmented (the
	// peer's: pages restored or promoted are protected from pages saved
	// once) or DRAMLRU (one LRU, the peer's order before 2026-12-01).
	DRAMPolicy string `json:"dram_policy"`
	// SSDCut models the peer's restore-or-recompute choice (fabric/store/ssdrate.go):
	// a lookup stops at the first page held only on the local SSD when reading
	// it takes longer than computing its tokens.
	SSDCut bool `json:"ssd_cut"`
	// NoReadmit models the peer before readmission (fabric/store/readmit.go): a
	// page held only on SSD that a prefill computed is not saved back into DRAM.
	NoReadmit bool `json:"no_readmit"`
	// ReadmitAll models the peer's readmission before 2026-12-02
	// (--ssd-readmit-all): into a full DRAM tier too, without judging the
	// page against the one it pushes out (fabric/store/readmit.go).
	ReadmitAll bool `json:"readmit_all"`

	Cost CostModel `json:"cost"`
}

// DRAM eviction orders (Config.DRAMPolicy).
const (
	DRAMSegmented = "slru"
	DRAMLRU       = "lru"
)

// ssdSlower reports whether reading a page from SSD takes longer than
// computing its tokens under the cost model.
func (c Config) ssdSlower() bool {
	read := c.Cost.LoadNs(Load{SSD: c.PageBytes()})
	return read > c.Cost.PrefillNs(int64(c.PageTokens))
}

// dramLRU returns the DRAM tier's eviction order for the policy.
func (c Config) dramLRU() *tiers.LRU {
	if c.DRAMPolicy == DRAMLRU {
		return tiers.NewLRU()
	}
	return tiers.NewSegmentedLRU(tiers.DRAMProtectedShare)
}

// CostModel turns pages and tokens into virtual time.
type CostModel struct {
	PrefillUsPerToken float64 `json:"prefill_us_per_token"` // prefill compute per missed token, µs
	DRAMGBps          float64 `json:"dram_gbps"`            // DRAM → HBM, GB/s (1e9 bytes/s)
	SSDGBps           float64 `json:"ssd_gbps"`             // SSD → HBM (through a DRAM buffer), GB/s
	NetGBps           float64 `json:"net_gbps"`             // remote peer → local HBM, GB/s
}

// Model is the KV geometry of one model at one TP rank.
type Model struct {
	Name      string `json:"name"`
	Layers    int    `json:"layers"`
	KVHeads   int    `json:"kv_heads"` // per rank
	HeadDim   int    `json:"head_dim"`
	DTypeSize int    `json:"dtype_size"` // bytes per element
	DType     string `json:"dtype"`
}

// Models are the geometries --model accepts (TP 1).
var Models = map[string]Model{
	"qwen3-8b":   {Name: "qwen3-8b", Layers: 36, KVHeads: 8, HeadDim: 128, DTypeSize: 2, DType: "bfloat16"},
	"llama3-8b":  {Name: "llama3-8b", Layers: 32, KVHeads: 8, HeadDim: 128, DTypeSize: 2, DType: "bfloat16"},
	"qwen3-32b":  {Name: "qwen3-32b", Layers: 64, KVHeads: 8, HeadDim: 128, DTypeSize: 2, DType: "bfloat16"},
	"llama3-70b": {Name: "llama3-70b", Layers: 80, KVHeads: 8, HeadDim: 128, DTypeSize: 2, DType: "bfloat16"},
}

// ModelNames returns the keys of Models, sorted.
func ModelNames() []string {
	var names []string
	for n := range Models {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// TokenBytes is the KV bytes of one token: every layer, K and V.
func (m Model) TokenBytes() uint64 {
	return 2 * uint64(m.Layers) * uint64(m.KVHeads) * uint64(m.HeadDim) * uint64(m.DTypeSize)
}

// Layout is the pagekey layout whose fingerprint starts every key chain.
func (m Model) Layout(pageTokens int) pagekey.Layout {
	return pagekey.Layout{
		Model: m.Name, DType: m.DType, NumLayers: uint32(m.Layers), KVHeads: uint32(m.KVHeads),
		HeadDim: uint32(m.HeadDim), TPSize: 1, PageTokens: uint32(pageTokens), ByteLayout: "page-first",
	}
}

// Default cost constants (docs/benchmarks.md, "sim", explains them).
const (
	// DefaultPrefillUsPerToken: Qwen3-8B is ~14 GFLOP per token in its
	// linear layers plus ~4 GFLOP of attention at a 15 K context; an H200
	// (989 TFLOP/s dense BF16) at ~45% MFU does ~450 TFLOP/s: ~40 µs/token.
	DefaultPrefillUsPerToken = 40
	// DefaultDRAMGBps: pinned host → H200 copy measured at 55 GB/s
	// (DESIGN.md §5), at the 90% restore target.
	DefaultDRAMGBps = 50
	// DefaultSSDGBps: one PCIe 4 NVMe drive reading large blocks.
	DefaultSSDGBps = 6
	// DefaultNetGBps: one 200 Gbit/s NIC at ~80% of line rate.
	DefaultNetGBps = 20
)

// DefaultConfig returns one host of Qwen3-8B on an H200 with 128 GiB of
// DRAM and 1 TiB of SSD, round-robin, no sharing.
func DefaultConfig() Config {
	return Config{
		Hosts: 1, Router: RoundRobin, Model: Models["qwen3-8b"], PageTokens: 64,
		HBMTokens: 512 << 10, DRAMBytes: 128 << 30, SSDBytes: 1 << 40, DRAMPolicy: DRAMSegmented,
		Cost: CostModel{
			PrefillUsPerToken: DefaultPrefillUsPerToken,
			DRAMGBps:          DefaultDRAMGBps, SSDGBps: DefaultSSDGBps, NetGBps: DefaultNetGBps,
		},
	}
}

// PageBytes is the size of one page.
func (c Config) PageBytes() uint64 { return uint64(c.PageTokens) * c.Model.TokenBytes() }

// Validate checks the config.
func (c Config) Validate() error {
	var errs []error
	if c.Hosts < 1 || c.Hosts > 4096 {
		errs = append(errs, fmt.Errorf("hosts %d: want 1..4096", c.Hosts))
	}
	if c.PageTokens < 1 || c.PageTokens > 1<<16 {
		errs = append(errs, fmt.Errorf("page tokens %d: want 1..65536", c.PageTokens))
	}
	if c.Model.TokenBytes() == 0 {
		errs = append(errs, fmt.Errorf("model %q has no KV geometry", c.Model.Name))
	}
	if c.HBMTokens < 0 {
		errs = append(errs, fmt.Errorf("hbm tokens %d: want >= 0", c.HBMTokens))
	}
	if _, err := c.Router.policy(); err != nil {
		errs = append(errs, err)
	}
	if c.DRAMPolicy != DRAMSegmented && c.DRAMPolicy != DRAMLRU {
		errs = append(errs, fmt.Errorf("dram policy %q: want %s or %s", c.DRAMPolicy, DRAMSegmented, DRAMLRU))
	}
	return errors.Join(append(errs, c.Cost.Validate())...)
}

// Validate checks the cost model.
func (m CostModel) Validate() error {
	var errs []error
	if m.PrefillUsPerToken <= 0 {
		errs = append(errs, fmt.Errorf("prefill %v µs/token: want > 0", m.PrefillUsPerToken))
	}
	for _, bw := range []struct {
		name string
		v    float64
	}{{"dram", m.DRAMGBps}, {"ssd", m.SSDGBps}, {"net", m.NetGBps}} {
		if bw.v <= 0 {
			errs = append(errs, fmt.Errorf("%s bandwidth %v GB/s: want > 0", bw.name, bw.v))
		}
	}
	return errors.Join(errs...)
}
