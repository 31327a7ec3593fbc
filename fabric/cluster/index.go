package cluster

import (
	"cmp"
	"context"
	"slices"
	"sync"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// index is this peer's view of the members' pages: the exact index of the
// members that announce every page (catalog.Remote), and the filters of
// those that publish compact summaries (catalog.Summaries, Config.
// CompactCatalog). A filter's claim is never acted on unasked: Extend has
// the member confirm the run it claims (Holds) before the lookup counts
// it, and remembers the answer (confirmed: what a load then fetches, and
// what later lookups count unasked for confirmTTL; refuted: claims not
// asked again for refuteTTL, or until the member's filter sets a bit
// (Gained) or is replaced; silent: members that did not answer, whose
// claims are not asked for silentTTL). Route's confirmation is its own
// (route.go).
type index struct {
	exact *catalog.Remote
	sums  catalog.Summaries
	// members answers for claims; nil: no claim counts (tests of the
	// exact index).
	members claimAsker
	now     func() time.Time // the clock of confirmations, refutations and silences (time.Now)

	mu        sync.Mutex
	confirmed map[pagekey.Key]catalog.RemotePage // pages members confirmed, with the asking session's layout and size
	fresh     map[claim]time.Time                // confirmations lookups may count unasked, until when
	refuted   map[int]map[pagekey.Key]time.Time  // claims members denied, by origin, until when
	nRefuted  int                                // entries in refuted
	silent    map[int]time.Time                  // members that did not answer a confirmation, until when
}

// claimAsker is what the index asks of the cluster (*Cluster).
type claimAsker interface {
	// askHolds returns how many leading pages of keys origin holds (Holds,
	// at most holdsMaxKeys keys), within ctx.
	askHolds(ctx context.Context, origin int, keys []pagekey.Key) (int, error)
	// noteClaim counts a confirmation, and whether it found the claim false.
	noteClaim(falseClaim bool)
}

// claim is one origin's claim of one key.
type claim struct {
	origin int
	key    pagekey.Key
}

const (
	maxConfirmed = 1 << 14         // confirmed pages kept (all forgotten when full): 1-2 MiB
	maxRefuted   = 1 << 14         // refuted claims kept (all forgotten when full): 1-2 MiB
	refuteTTL    = 5 * time.Second // a denied claim is not asked again for this long
	silentTTL    = 2 * time.Second // a member that did not answer is not asked again for this long
	confirmTTL   = 2 * time.Second // a confirmation counts unasked for this long
	// extendDeadline bounds the confirmations of one lookup, all together.
	extendDeadline = 250 * time.Millisecond
	maxAsks        = 3    // confirmations one Extend asks at most
	maxClaimers    = 8    // filter claimants a route confirms at most
	holdsMaxKeys   = 4096 // the most keys one Holds asks or answers (route.go)
	// claimFalse is the chance a full filter claims an absent key
	// (catalog.SummaryBitsPerPage; TestSummaryAgainstModel measures it).
	claimFalse = 0.15
	// maxFalseAsks bounds the false claims a lookup of pages nobody holds
	// expects to ask (minRun).
	maxFalseAsks = 0.5
)

// minRun is the shortest claimed run worth a question when members
// publish filters that could claim it: the least j with
// members × claimFalse^j ≤ maxFalseAsks (10 members: 2 pages, 60: 3,
// 1,000: 5), so a lookup of pages nobody holds asks about half a question
// on average. A shorter run held elsewhere is recomputed, not fetched.
func minRun(members int) int {
	j := 1
	for e := float64(members) * claimFalse; e > maxFalseAsks && j < 16; e *= claimFalse {
		j++
	}
	return j
}

func newIndex() *index {
	return &index{exact: catalog.NewRemote(), now: time.Now, confirmed: map[pagekey.Key]catalog.RemotePage{},
		fresh: map[claim]time.Time{}, refuted: map[int]map[pagekey.Key]time.Time{}, silent: map[int]time.Time{}}
}

// Add records an exact announcement.
func (x *index) Add(origin int, k pagekey.Key, layout pagekey.Fingerprint, size uint64) error {
	return x.exact.Add(origin, k, layout, size)
}

// Remove records that origin no longer holds k: an exact drop, or a page
// it was asked for and did not have (its filter's claim is refuted).
func (x *index) Remove(origin int, k pagekey.Key) {
	x.exact.Remove(origin, k)
	if !x.sums.Has(origin) {
		return
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	x.unconfirmLocked(origin, k)
	x.refuteLocked(origin, k, x.now())
}

// DropOrigin forgets everything of origin; it returns how many exact pages.
func (x *index) DropOrigin(origin int) int {
	n := x.exact.DropOrigin(origin)
	x.sums.Drop(origin)
	x.mu.Lock()
	defer x.mu.Unlock()
	for k := range x.confirmed {
		x.unconfirmLocked(origin, k)
	}
	x.dropRefutedLocked(origin)
	delete(x.silent, origin)
	return n
}

// Gained records that origin's filter claims new keys (a bit it set): its
// claims denied before are asked again, for a page may have arrived.
func (x *index) Gained(origin int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.dropRefutedLocked(origin)
}

// Get returns the holders of k: those that announced it, and those that
// confirmed it to a lookup.
func (x *index) Get(k pagekey.Key) (catalog.RemotePage, bool) {
	p, ok := x.exact.Get(k)
	x.mu.Lock()
	c, cok := x.confirmed[k]
	x.mu.Unlock()
	switch {
	case !cok:
		return p, ok
	case !ok || p.Layout != c.Layout || p.Size != c.Size:
		return c, true
	}
	for o := c.Holders.First(); o >= 0; o = c.Holders.Next(o) {
		_ = p.Holders.Add(o) // a holder's id: in range
	}
	return p, true
}

// Len is how many distinct pages members announced (filters' pages are not
// counted: see Summarized).
func (x *index) Len() int { return x.exact.Len() }

// Count is how many pages origin announced, or its filter holds (an
// estimate).
func (x *index) Count(origin int) int {
	if x.sums.Has(origin) {
		return x.sums.Pages(origin)
	}
	return x.exact.Count(origin)
}

// Summarized is the memory of the filters held, in bytes.
func (x *index) Summarized() int { return x.sums.Bytes() }

// Leading returns every origin's leading run of keys: announced, or claimed
// by its filter (at most maxClaimers claimants, the longest claims, none
// shorter than minRun unless it covers keys; claims refuted lately left
// out). Route confirms each.
func (x *index) Leading(keys []pagekey.Key) []catalog.Held {
	out := x.exact.Leading(keys)
	claims := x.sums.Leading(keys, x.isRefuted)
	least := min(len(keys), minRun(x.sums.Len()))
	claims = slices.DeleteFunc(claims, func(h catalog.Held) bool { return h.Pages < least })
	sortClaims(claims)
	return append(out, claims[:min(len(claims), maxClaimers)]...)
}

// Extend returns the origin to fetch each leading page of keys from (see
// catalog.Remote.Extend): the exact index's run, then runs members'
// filters claim, the longest claim first, each counted only as far as its
// member confirms it (at most maxAsks claims asked, a claim longer than
// holdsMaxKeys in pieces, all within extendDeadline; a member that does
// not answer counts only the pieces it confirmed, and its claims are
// passed over for silentTTL).
func (x *index) Extend(keys []pagekey.Key, layout pagekey.Fingerprint, size uint64, usable func(int) bool) []int {
	from := x.exact.Extend(keys, layout, size, usable)
	ctx, cancel := context.WithTimeout(context.Background(), extendDeadline)
	defer cancel()
	for asks := 0; len(from) < len(keys) && asks < maxAsks; {
		rest := keys[len(from):]
		if o, n := x.fromConfirmed(rest, layout, size, usable); n > 0 {
			for range n {
				from = append(from, o)
			}
			continue
		}
		claims := x.sums.Leading(rest, x.isRefuted)
		least := min(len(rest), minRun(x.sums.Len()))
		claims = slices.DeleteFunc(claims, func(h catalog.Held) bool {
			return h.Pages < least || usable != nil && !usable(h.Origin) || x.isSilent(h.Origin)
		})
		sortClaims(claims)
		got, origin := 0, -1
		for _, cl := range claims {
			if asks == maxAsks || ctx.Err() != nil {
				break
			}
			asks++
			if got = x.confirm(ctx, cl, rest, layout, size); got > 0 {
				origin = cl.Origin
				break
			}
		}
		if origin < 0 {
			break
		}
		for range got {
			from = append(from, origin)
		}
	}
	return from
}

// confirm asks cl's origin for the run its filter claims of keys and
// records the answer; it returns how many pages the origin holds (those it
// confirmed before it stopped answering, if it did: it is silent then).
func (x *index) confirm(ctx context.Context, cl catalog.Held, keys []pagekey.Key, layout pagekey.Fingerprint, size uint64) int {
	if x.members == nil {
		return 0
	}
	n, err := x.askRun(ctx, cl.Origin, keys[:cl.Pages])
	if err == nil {
		x.members.noteClaim(n < cl.Pages)
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	if err != nil {
		x.silent[cl.Origin] = x.now().Add(silentTTL) // markSilent, under the lock held here
	}
	if len(x.confirmed)+n > maxConfirmed || len(x.fresh)+n > maxConfirmed {
		clear(x.confirmed)
		clear(x.fresh)
	}
	until := x.now().Add(confirmTTL)
	for _, k := range keys[:n] {
		x.fresh[claim{cl.Origin, k}] = until
		p, ok := x.confirmed[k]
		if !ok || p.Layout != layout || p.Size != size {
			p = catalog.RemotePage{Layout: layout, Size: size}
		}
		_ = p.Holders.Add(cl.Origin) // a filter's origin: in range
		x.confirmed[k] = p
	}
	if err == nil && n < cl.Pages {
		x.refuteLocked(cl.Origin, keys[n], x.now())
	}
	return n
}

// askRun asks origin how many leading pages of keys it holds, in pieces of
// at most holdsMaxKeys (the most one Holds answers); a piece held short
// ends the questions. On an error it returns the pages confirmed before.
func (x *index) askRun(ctx context.Context, origin int, keys []pagekey.Key) (int, error) {
	n := 0
	for n < len(keys) {
		piece := keys[n:min(len(keys), n+holdsMaxKeys)]
		got, err := x.members.askHolds(ctx, origin, piece)
		if err != nil {
			return n, err
		}
		n += min(got, len(piece))
		if got < len(piece) {
			break
		}
	}
	return n, nil
}

func (x *index) isRefuted(origin int, k pagekey.Key) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	until, ok := x.refuted[origin][k]
	if ok && x.now().After(until) {
		delete(x.refuted[origin], k)
		x.nRefuted--
		return false
	}
	return ok
}

// isFresh says whether origin confirmed k within confirmTTL.
func (x *index) isFresh(origin int, k pagekey.Key) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	until, ok := x.fresh[claim{origin, k}]
	return ok && x.now().Before(until)
}

// markSilent passes origin over for silentTTL: it did not answer.
func (x *index) markSilent(origin int) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.silent[origin] = x.now().Add(silentTTL)
}

// isSilent says whether origin did not answer a confirmation lately.
func (x *index) isSilent(origin int) bool {
	x.mu.Lock()
	defer x.mu.Unlock()
	until, ok := x.silent[origin]
	if ok && !x.now().Before(until) {
		delete(x.silent, origin)
		return false
	}
	return ok
}

func (x *index) refuteLocked(origin int, k pagekey.Key, now time.Time) {
	if x.nRefuted >= maxRefuted {
		clear(x.refuted)
		x.nRefuted = 0
	}
	m := x.refuted[origin]
	if m == nil {
		m = map[pagekey.Key]time.Time{}
		x.refuted[origin] = m
	}
	if _, ok := m[k]; !ok {
		x.nRefuted++
	}
	m[k] = now.Add(refuteTTL)
}

func (x *index) dropRefutedLocked(origin int) {
	x.nRefuted -= len(x.refuted[origin])
	delete(x.refuted, origin)
}

func (x *index) unconfirmLocked(origin int, k pagekey.Key) {
	delete(x.fresh, claim{origin, k})
	p, ok := x.confirmed[k]
	if !ok || !p.Holders.Has(origin) {
		return
	}
	p.Holders.Remove(origin)
	if p.Holders.Empty() {
		delete(x.confirmed, k)
		return
	}
	x.confirmed[k] = p
}

// sortClaims orders claims longest first, then by origin.
func sortClaims(hs []catalog.Held) {
	slices.SortFunc(hs, func(a, b catalog.Held) int {
		if c := cmp.Compare(b.Pages, a.Pages); c != 0 {
			return c
		}
		return cmp.Compare(a.Origin, b.Origin)
	})
}

// fromConfirmed returns the leading run of keys one usable member confirmed
// within confirmTTL and its filter still claims: no question asked. (A page
// dropped since may still be claimed, its bits set by other keys, so an
// older confirmation is asked again.)
func (x *index) fromConfirmed(keys []pagekey.Key, layout pagekey.Fingerprint, size uint64, usable func(int) bool) (origin, n int) {
	pages := make([]catalog.RemotePage, 0, len(keys))
	x.mu.Lock()
	for _, k := range keys {
		p, ok := x.confirmed[k]
		if !ok || p.Layout != layout || p.Size != size {
			break
		}
		pages = append(pages, p)
	}
	x.mu.Unlock()
	if len(pages) == 0 {
		return -1, 0
	}
	for o := pages[0].Holders.First(); o >= 0; o = pages[0].Holders.Next(o) {
		if usable != nil && !usable(o) {
			continue
		}
		for n < len(pages) && pages[n].Holders.Has(o) && x.sums.Claims(o, keys[n]) && x.isFresh(o, keys[n]) {
			n++
		}
		if n > 0 {
			return o, n
		}
	}
	return -1, 0
}
