package engineapi

import (
	"fmt"
	"github.com/orbitkv/orbitkv/fabric/store"
	"time"

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

// lookup finds the longest stored prefix of keys and, with take, pins it
// under a lease bounded by the query budget: a hit that does not fit the
// budget is shortened, never over-committed.
// recompute is the engine's prefill rate in tokens/s (0: unknown), which
// decides whether SSD-only pages are worth restoring (ssdrate.go).
func (p *API) lookup(sess *session, keys []pagekey.Key, take bool, ttl time.Duration, recompute float64) lookupResult {
	res := p.cat.Lookup(keys, time.Now().UnixNano())
	cut, dram := p.pages.CutSlowSSD(&sess.Engine, recompute, keys[:res.Hit])
	out := lookupResult{hit: res.Hit, recompute: res.Hit - cut}
	if cut < res.Hit { // the pages before the cut: the DRAM prefix, and a probe's SSD page
		res.Hit, res.DRAM, res.SSD, out.hit = cut, dram, cut-dram, cut
	}
	defer func() {
		p.recordLookup(len(keys), out.hit)
		p.m.lookupRecompute.Add(float64(out.recompute))
		p.m.lookupBudgetCut.Add(float64(out.budgetHits))
	}()
	if !take || res.Hit == 0 {
		out.dram, out.ssd = res.DRAM, res.SSD
		if out.recompute == 0 {
			p.extendRemote(sess, keys, &out)
		}
		return out
	}
	l := &lease{id: newID("l-"), expires: p.now().Add(ttl)}
	l.pins, out.dram, out.ssd, out.budgetHits = p.pages.LeasePins(keys[:res.Hit])
	out.hit = l.pins.Len()
	if out.hit > 0 {
		out.lease = l
		p.m.leases.Inc()
		p.m.queryBytes.Add(float64(l.pins.Bytes()))
	}
	if out.hit == res.Hit && out.recompute == 0 {
		p.extendRemote(sess, keys, &out)
	}
	return out
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
