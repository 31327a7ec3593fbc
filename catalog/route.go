package catalog

import "github.com/orbitkv/orbitkv/internal/pagekey"

// What a router asks of the catalog: how many leading pages of a chain each
// holder has, and in which tiers, without touching what eviction reads.

// Run is a stretch of consecutive pages held in one tier.
type Run struct {
	Tier  Tier
	Pages int
}

// Runs folds per-page tiers into runs, in order.
func Runs(tiers []Tier) []Run {
	var out []Run
	for _, t := range tiers {
		if n := len(out); n > 0 && out[n-1].Tier == t {
			out[n-1].Pages++
			continue
		}
		out = append(out, Run{Tier: t, Pages: 1})
	}
	return out
}

// Peek returns the tier of each leading page of keys this peer holds, up to
// the first it does not. Unlike Lookup it stamps no access time and counts
// no hit: a route query is not a use of the pages.
func (c *Catalog) Peek(keys []pagekey.Key) []Tier {
	var out []Tier
	for _, k := range keys {
		e, ok := c.Get(k)
		if !ok || e.Tier() == TierNone {
			break
		}
		out = append(out, e.Tier())
	}
	return out
}

// Held is how many leading pages of a chain one origin announced.
type Held struct {
	Origin int
	Pages  int
}

// Leading returns, for every origin that announced keys[0], how many
// leading keys of the chain it announced (it holds pages 0..Pages-1), in
// origin order. A holder of pages 1..k but not 0 has no leading run and is
// not listed. Keys chain the layout, so no layout is asked.
func (r *Remote) Leading(keys []pagekey.Key) []Held {
	var out []Held // the holders of keys[0]; those still in the run have Pages == i
	for i, k := range keys {
		p, ok := r.Get(k)
		if !ok {
			break
		}
		if i == 0 {
			for o := p.Holders.First(); o >= 0; o = p.Holders.Next(o) {
				out = append(out, Held{Origin: o, Pages: 1})
			}
			continue
		}
		live := 0
		for j := range out {
			if out[j].Pages == i && p.Holders.Has(out[j].Origin) {
				out[j].Pages++
				live++
			}
		}
		if live == 0 {
			break
		}
	}
	return out
}
