package engineapi

import (
	"fmt"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/fabric/store"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// lease holds pins on the pages of a lookup until it is released, expires or
// its session closes. Its bytes count against the query budget.
type lease struct {
	id      string
	pins    store.Pins
	expires time.Time
}

// lookupResult is a Lookup's answer.
type lookupResult struct {
	hit        int
	dram, ssd  int
	lease      *lease
	remote     int // pages of the hit only members hold (fetched at load)
	budgetHits int // pages cut from the hit by the query budget
	recompute  int // pages cut because the SSD is slower than the engine (ssdrate.go)
}

// lookupAsk is what a Lookup asks besides its keys.
type lookupAsk struct {
	take bool          // lease the hit
	ttl  time.Duration // the lease's time
	// recompute is the engine's prefill rate in tokens/s (0: unknown),
	// which decides whether SSD-only pages are worth restoring (ssdrate.go).
	recompute float64
	// held is how many leading pages the engine holds itself: they must be
	// stored for the hit to pass them but are not leased, not charged to
	// the budget and not judged by the SSD cut.
	held int
}

// lookup finds the longest stored prefix of keys and, with take, pins it
// (past the pages the engine holds) under a lease bounded by the query
// budget: a hit that does not fit the budget is shortened, never
// over-committed.
func (p *API) lookup(sess *session, keys []pagekey.Key, ask lookupAsk) lookupResult {
	p.pages.NoteAsked(&sess.Engine, keys) // what readmissions are judged by (fabric/store/readmit.go)
	res := p.cat.Lookup(keys, p.now().UnixNano())
	held := min(ask.held, res.Hit)
	cut, dram := p.pages.CutSlowSSD(&sess.Engine, ask.recompute, keys[held:res.Hit])
	out := lookupResult{hit: held + cut, recompute: res.Hit - held - cut}
	if out.recompute > 0 { // the pages before the cut: the DRAM prefix, and a probe's SSD page
		out.dram, out.ssd = dram, cut-dram
	} else {
		out.dram, out.ssd = countTiers(res.Tiers[held:])
	}
	defer func() {
		p.recordLookup(len(keys), out.hit)
		p.m.lookupRecompute.Add(float64(out.recompute))
		p.m.lookupBudgetCut.Add(float64(out.budgetHits))
	}()
	if !ask.take || out.hit == held { // nothing to lease: no lease asked, or the engine holds the hit
		if out.recompute == 0 {
			p.extendRemote(sess, keys, &out)
		}
		return out
	}
	l := &lease{id: newID("l-"), expires: p.now().Add(ask.ttl)}
	l.pins, out.dram, out.ssd, out.budgetHits = p.pages.LeasePins(keys[held:out.hit])
	out.hit = held + l.pins.Len()
	if l.pins.Len() > 0 {
		out.lease = l
		p.m.leases.Inc()
		p.m.queryBytes.Add(float64(l.pins.Bytes()))
	}
	if out.hit == held+cut && out.recompute == 0 {
		p.extendRemote(sess, keys, &out)
	}
	return out
}

// countTiers counts a lookup's hit pages by tier.
func countTiers(tiers []catalog.Tier) (dram, ssd int) {
	for _, t := range tiers {
		if t == catalog.TierDRAM {
			dram++
		} else {
			ssd++
		}
	}
	return dram, ssd
}

// extendRemote extends a lookup's hit, which holds the whole local prefix,
// with the pages that follow it on live members. They are not leased here:
// the load fetches them (remote.go), and one gone meanwhile fails its
// blocks, which the engine recomputes.
func (p *API) extendRemote(sess *session, keys []pagekey.Key, out *lookupResult) {
	c := p.cluster
	if c == nil || out.hit >= len(keys) {
		return
	}
	n := c.Extend(keys[out.hit:], sess.FP, sess.PageBytes)
	out.remote = n
	out.hit += n
}

// releaseLease unpins a lease's pages and returns its budget.
func (p *API) releaseLease(l *lease) {
	p.pages.ReleasePins(l.pins)
	p.m.leases.Dec()
	p.m.queryBytes.Sub(float64(l.pins.Bytes()))
}

// endLease ends a lease a finished Load named with end_lease, whichever
// session holds it ("" or a lease already gone: nothing to do).
func (p *API) endLease(id string) {
	if id == "" {
		return
	}
	for _, holder := range p.sessions.list() {
		if l, ok := holder.takeLease(id); ok {
			p.releaseLease(l)
			return
		}
	}
}

func (p *API) recordLookup(asked, hit int) {
	p.m.lookupHit.Add(float64(hit))
	p.m.lookupMiss.Add(float64(asked - hit))
}

// checkLoadLease checks the lease a Load names ("" names none): it must be
// live and unexpired at t, and held by a session of this peer for the
// loading session's model (its layout up to the TP rank: the vLLM
// scheduler's lookup-only session takes the leases its workers load with).
// An unknown or expired lease is NotFound, another model's
// FailedPrecondition; the adapters then load without it.
func (p *API) checkLoadLease(sess *session, id string, t time.Time) error {
	if id == "" {
		return nil
	}
	for _, holder := range p.sessions.list() {
		holder.mu.Lock()
		l, ok := holder.mu.leases[id]
		holder.mu.Unlock()
		switch {
		case !ok:
			continue
		case t.After(l.expires):
			return wrapNotFound("lease %q expired at %s", id, l.expires.Format(time.RFC3339Nano))
		case !sameModel(holder.Layout, sess.Layout):
			return fmt.Errorf("%w: lease %q is held by session %s for model %q (layout %s), not this session's %q (layout %s)",
				errLayoutMismatch, id, holder.id, holder.Layout.Model, holder.FP, sess.Layout.Model, sess.FP)
		}
		return nil
	}
	return invalidLease(id)
}

// sameModel reports whether two layouts differ at most in their TP rank.
func sameModel(a, b pagekey.Layout) bool {
	a.TPRank, b.TPRank = 0, 0
	return a == b
}
