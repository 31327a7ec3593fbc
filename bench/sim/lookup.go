package sim

import (
	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// lease is one hit page held in place while its request is prefilled.
type lease struct {
	host int
	key  pagekey.Key
	tier catalog.Tier
}

// plan is where a request's hit pages come from.
type plan struct {
	hbm, dram, ssd, remote int // pages by source
	load                   Load
	leases                 []lease
}

func (p plan) hitPages() int { return p.hbm + p.dram + p.ssd + p.remote }

// lookup plans request keys on host h at the current virtual time: it walks
// the chain taking runs from the HBM prefix cache, the local catalog and,
// with sharing, the peer whose catalog holds the longest run, until no one
// holds the next page. Every catalog hit is leased (pinned and touched).
func (sm *sim) lookup(h int, keys []pagekey.Key) plan {
	var p plan
	local := sm.hosts[h].store
	local.noteAsked(keys)
	for pos := 0; pos < len(keys); {
		start := pos
		n := local.hbmPrefix(keys[pos:])
		p.hbm += n
		pos += n
		pos += sm.take(&p, h, h, keys[pos:], sm.cutSlowSSD(local.cat.Lookup(keys[pos:], sm.now)))
		if sm.cfg.Sharing && pos < len(keys) {
			if o, r := sm.bestPeer(h, keys[pos:]); r.Hit > 0 {
				pos += sm.take(&p, h, o, keys[pos:], r)
			}
		}
		if pos == start {
			break
		}
	}
	return p
}

// cutSlowSSD shortens a local hit to end before its first SSD-only page
// when the config models the peer's cut and the SSD is slower than
// recompute.
func (sm *sim) cutSlowSSD(r catalog.Result) catalog.Result {
	if !sm.cfg.SSDCut || !sm.cfg.ssdSlower() {
		return r
	}
	for i, t := range r.Tiers {
		if t == catalog.TierSSD {
			r.Hit, r.Tiers = i, r.Tiers[:i]
			break
		}
	}
	return r
}

// take adds the pages of r, found on host o for a request on host h, to p
// and leases them on o.
func (sm *sim) take(p *plan, h, o int, keys []pagekey.Key, r catalog.Result) int {
	owner := sm.hosts[o].store
	bytes := owner.pageBytes
	for i, t := range r.Tiers {
		owner.pin(keys[i], t)
		p.leases = append(p.leases, lease{host: o, key: keys[i], tier: t})
		switch {
		case o != h && t == catalog.TierSSD:
			p.remote++
			p.load.RemoteSSD += bytes
		case o != h:
			p.remote++
			p.load.RemoteDRAM += bytes
		case t == catalog.TierSSD:
			p.ssd++
			p.load.SSD += bytes
		default:
			p.dram++
			p.load.DRAM += bytes
		}
	}
	return r.Hit
}

// bestPeer returns the host other than h whose catalog holds the longest
// run of keys (lowest index on ties) and its lookup result.
func (sm *sim) bestPeer(h int, keys []pagekey.Key) (int, catalog.Result) {
	best, bestRes := -1, catalog.Result{}
	for o, other := range sm.hosts {
		if o == h {
			continue
		}
		if r := other.store.cat.Lookup(keys, sm.now); r.Hit > bestRes.Hit {
			best, bestRes = o, r
		}
	}
	return best, bestRes
}

// release ends a finished request's leases.
func (sm *sim) release(p plan) {
	for _, l := range p.leases {
		sm.hosts[l.host].store.unpin(l.key, l.tier)
	}
}

// localPrefix is how many leading keys host h holds itself (HBM, DRAM or
// SSD), without leasing or touching them: what a prefix-aware router sees.
func (sm *sim) localPrefix(h int, keys []pagekey.Key) int {
	s := sm.hosts[h].store
	pos := 0
	for pos < len(keys) {
		start := pos
		pos += s.hbmPrefix(keys[pos:])
		pos += s.cat.Lookup(keys[pos:], sm.now).Hit
		if pos == start {
			break
		}
	}
	return pos
}
