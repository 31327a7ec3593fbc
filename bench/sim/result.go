package sim

import (
	"slices"
)

// TokenCounts are prompt tokens by where their KV came from.
type TokenCounts struct {
	Input  int64 `json:"input"`
	HBM    int64 `json:"hbm"`    // the engine's own prefix cache
	DRAM   int64 `json:"dram"`   // local DRAM tier
	SSD    int64 `json:"ssd"`    // local SSD tier
	Remote int64 `json:"remote"` // another host's DRAM or SSD
	Miss   int64 `json:"miss"`   // computed
}

// ByteCounts are bytes moved, by path.
type ByteCounts struct {
	HBMFromDRAM   uint64 `json:"hbm_from_dram"`
	HBMFromSSD    uint64 `json:"hbm_from_ssd"`
	RemoteToLocal uint64 `json:"remote_to_local"`
	HBMToDRAM     uint64 `json:"hbm_to_dram"` // saves of computed and fetched pages
	DRAMToSSD     uint64 `json:"dram_to_ssd"` // demotions
}

// PageCounts counts pages per tier.
type PageCounts struct {
	HBM  int64 `json:"hbm"`
	DRAM int64 `json:"dram"`
	SSD  int64 `json:"ssd"`
}

// Counters accumulate over a run.
type Counters struct {
	Tokens       TokenCounts `json:"tokens"`
	Bytes        ByteCounts  `json:"bytes"`
	EvictedPages PageCounts  `json:"evicted_pages"`
	DemotedPages int64       `json:"demoted_pages"`
	UnsavedPages int64       `json:"unsaved_pages"` // no DRAM room (every page pinned, or no DRAM)
	// ColderReadmits are readmissions refused: the page asked for no more
	// often lately than the one it would push out (fabric/store/readmit.go).
	ColderReadmits int64 `json:"colder_readmits"`
}

func (c *Counters) add(p plan, pageTokens, input int64) {
	t := &c.Tokens
	t.Input += input
	t.HBM += int64(p.hbm) * pageTokens
	t.DRAM += int64(p.dram) * pageTokens
	t.SSD += int64(p.ssd) * pageTokens
	t.Remote += int64(p.remote) * pageTokens
	t.Miss += input - int64(p.hitPages())*pageTokens
	c.Bytes.HBMFromDRAM += p.load.DRAM
	c.Bytes.HBMFromSSD += p.load.SSD
	c.Bytes.RemoteToLocal += p.load.RemoteDRAM + p.load.RemoteSSD
}

// HitRates are token fractions of the input; they sum to 1.
type HitRates struct {
	HBM    float64 `json:"hbm"`
	DRAM   float64 `json:"dram"`
	SSD    float64 `json:"ssd"`
	Remote float64 `json:"remote"`
	Miss   float64 `json:"miss"`
}

// Latency is a distribution summary in milliseconds.
type Latency struct {
	Mean float64 `json:"mean"`
	P50  float64 `json:"p50"`
	P90  float64 `json:"p90"`
	P99  float64 `json:"p99"`
	Max  float64 `json:"max"`
}

// Compute is prefill GPU time in seconds.
type Compute struct {
	NoCacheS  float64 `json:"no_cache_s"` // every input token computed
	ComputedS float64 `json:"computed_s"` // missed tokens computed
	SavedS    float64 `json:"saved_s"`    // NoCacheS - ComputedS
	SavedFrac float64 `json:"saved_frac"`
	LoadS     float64 `json:"load_s"`      // time spent loading hit pages
	NetSavedS float64 `json:"net_saved_s"` // SavedS - LoadS
}

// Result is what a run reports.
type Result struct {
	Config   Config    `json:"config"`
	Requests int       `json:"requests"`
	Counters           // tokens, bytes, evictions
	HitRate  HitRates  `json:"hit_rate"`
	TTFTms   Latency   `json:"ttft_ms"`
	Prefill  Compute   `json:"prefill"`
	SpanS    float64   `json:"span_s"`    // first arrival to last first token
	HostBusy []float64 `json:"host_busy"` // fraction of SpanS each host was loading or computing
}

func (sm *sim) result(reqs []Request) *Result {
	r := &Result{Config: sm.cfg, Requests: len(reqs), Counters: sm.c}
	t := sm.c.Tokens
	if in := float64(t.Input); in > 0 {
		r.HitRate = HitRates{float64(t.HBM) / in, float64(t.DRAM) / in, float64(t.SSD) / in, float64(t.Remote) / in, float64(t.Miss) / in}
	}
	r.TTFTms = latency(sm.ttft)
	us := sm.cfg.Cost.PrefillUsPerToken
	r.Prefill = Compute{NoCacheS: float64(t.Input) * us / 1e6, ComputedS: float64(t.Miss) * us / 1e6}
	r.Prefill.SavedS = r.Prefill.NoCacheS - r.Prefill.ComputedS
	if r.Prefill.NoCacheS > 0 {
		r.Prefill.SavedFrac = r.Prefill.SavedS / r.Prefill.NoCacheS
	}
	r.Prefill.LoadS = float64(sm.loadNs) / 1e9
	r.Prefill.NetSavedS = r.Prefill.SavedS - r.Prefill.LoadS
	end := int64(0)
	for i := range reqs {
		end = max(end, arrivalNs(&reqs[i])+sm.ttft[reqs[i].Index])
	}
	r.SpanS = float64(end-arrivalNs(&reqs[0])) / 1e9
	for _, h := range sm.hosts {
		frac := 0.0
		if r.SpanS > 0 {
			frac = float64(h.busyNs) / 1e9 / r.SpanS
		}
		r.HostBusy = append(r.HostBusy, frac)
	}
	return r
}

// latency summarizes nanosecond samples in milliseconds (nearest rank).
func latency(ns []int64) Latency {
	if len(ns) == 0 {
		return Latency{}
	}
	s := slices.Clone(ns)
	slices.Sort(s)
	var sum float64
	for _, v := range s {
		sum += float64(v)
	}
	pct := func(p float64) float64 {
		i := int(p*float64(len(s))+0.999999) - 1
		return float64(s[max(0, min(len(s)-1, i))]) / 1e6
	}
	return Latency{Mean: sum / float64(len(s)) / 1e6, P50: pct(0.50), P90: pct(0.90), P99: pct(0.99), Max: float64(s[len(s)-1]) / 1e6}
}
