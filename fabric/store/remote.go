package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/transfer"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// Remote pages: a load names pages this peer does not hold but a member
// announced; they are fetched over the data plane into fresh DRAM slots,
// verified on receipt, recorded in the catalog as this peer's own (so the
// load, and later lookups, find them here) and then loaded like any DRAM
// page. The other way, Open serves this peer's pages to members.

// Members is what the store's remote fetch needs of the cluster
// (fabric/cluster's *Cluster implements it; the store never imports the
// cluster). Origins are the small integers of catalog.Holders.
type Members interface {
	// Remote returns what members announced of k.
	Remote(k pagekey.Key) (catalog.RemotePage, bool)
	// Usable says whether origin is a live member whose announcements this
	// peer holds in full (its pages may be fetched).
	Usable(origin int) bool
	// Route returns the transport that reaches origin and origin's
	// endpoint on it (the cluster chooses per member: RDMA where both ends
	// have a usable device, the TCP data plane otherwise); false when
	// origin is not alive.
	Route(origin int) (t transfer.Transport, endpoint string, ok bool)
	// Forget drops origin from k's holders: it no longer has the page, or
	// sent it corrupt.
	Forget(origin int, k pagekey.Key)
	// NoteFetch counts a fetched page by result (ok, missing, corrupt,
	// failed) and the bytes of one that arrived.
	NoteFetch(result string, bytes uint64)
}

// fetchRemote fetches the pages of reqs that no local tier holds and a live
// member announced with the session's layout. A page that cannot be fetched
// fails its request here, with the reason; the others are left to the load.
// It returns which requests' pages it fetched and stored here (nil: none
// asked), so the load reports them as remote, not as DRAM hits.
func (s *Store) fetchRemote(ctx context.Context, sess *Engine, reqs []PageReq, res []Result) []bool {
	c := s.members
	if c == nil {
		return nil
	}
	byOrigin := map[int][]int{}
	prev := -1
	for i, r := range reqs {
		if res[i].Code != CodePending {
			continue
		}
		if _, ok := s.cat.Get(r.Key); ok {
			continue
		}
		p, ok := c.Remote(r.Key)
		if !ok || p.Layout != sess.FP || p.Size != sess.PageBytes {
			continue
		}
		o := prev
		if !p.Holders.Has(o) {
			if o = pickUsable(p.Holders, c.Usable); o < 0 {
				continue // no live holder: the load reports the page not found
			}
		}
		byOrigin[o] = append(byOrigin[o], i)
		prev = o
	}
	if len(byOrigin) == 0 {
		return nil
	}
	fetched := make([]bool, len(reqs)) // each origin's goroutine writes its own indices
	var wg sync.WaitGroup
	for o, idx := range byOrigin {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.fetchFrom(ctx, sess, o, reqs, idx, res, fetched)
		}()
	}
	wg.Wait()
	return fetched
}

// fetchFrom fetches reqs[idx] from one member over the transport its route
// names, verifies every page that arrived and commits the good ones.
func (s *Store) fetchFrom(ctx context.Context, sess *Engine, origin int, reqs []PageReq, idx []int, res []Result, fetched []bool) {
	c := s.members
	tr, endpoint, ok := c.Route(origin)
	if !ok {
		for _, i := range idx {
			c.Forget(origin, reqs[i].Key)
			res[i] = notFound("page %s: its holder left the cluster", reqs[i].Key)
		}
		return
	}
	batch, items := s.planFetch(ctx, sess, reqs, idx, res)
	if len(batch) == 0 {
		return
	}
	s.m.inflight.Inc()
	start := time.Now()
	got := tr.Submit(ctx, endpoint, batch)
	s.m.fetchSeconds.Observe(time.Since(start).Seconds())
	s.checkFetched(batch, got)
	s.m.inflight.Dec()
	var arrived []*saveItem
	for j, it := range items {
		if err := got[j].Err; err != nil {
			s.failFetch(origin, endpoint, it, err, res)
			continue
		}
		h := got[j].Header
		clear(s.pool.Bytes(it.slot)[h.Length:]) // as a save leaves the padding
		it.entry = s.dramEntry(h.Key, h.Layout, h.Length, h.Checksum, it.slot)
		arrived = append(arrived, it)
		c.NoteFetch("ok", h.Length)
	}
	// commitSaves reports into its own results: the load's stay pending.
	scratch := make([]Result, len(reqs))
	s.commitSaves(arrived, scratch)
	for _, it := range arrived {
		if scratch[it.i].Code != CodeOK {
			res[it.i] = scratch[it.i]
			continue
		}
		fetched[it.i] = true
	}
}

// planFetch takes a fresh DRAM slot for each page of reqs[idx] and names
// it as a Read's local region: the transport writes each page straight
// into its slot.
func (s *Store) planFetch(ctx context.Context, sess *Engine, reqs []PageReq, idx []int, res []Result) ([]transfer.RemoteDesc, []*saveItem) {
	batch := make([]transfer.RemoteDesc, 0, len(idx))
	items := make([]*saveItem, 0, len(idx))
	for _, i := range idx {
		slot, err := s.allocDRAM(ctx, sess.PageBytes)
		if err != nil {
			res[i] = FailResult(fmt.Errorf("dram slot for a remote page: %w", err))
			continue
		}
		batch = append(batch, transfer.RemoteDesc{Op: transfer.Read, Remote: transfer.PageKey(reqs[i].Key, sess.FP),
			Len: sess.PageBytes, Local: s.dramR, LocalOff: s.pool.Offset(slot)})
		items = append(items, &saveItem{i: i, key: reqs[i].Key, slot: slot})
	}
	return batch, items
}

// checkFetched verifies every completed Read (DESIGN.md §7: every page is
// checked on network receive): the header the remote sent must name the
// page asked for, at the size asked for, and the bytes must match its
// checksum — summed here, on up to copyWorkers cores, unless the transport
// already did as the bytes landed (Completion.Verified). A page that fails
// gets a *page.CorruptError; none is ever stored.
func (s *Store) checkFetched(batch []transfer.RemoteDesc, got []transfer.Completion) {
	parallel(len(batch), func(j int) {
		d, h := batch[j], got[j].Header
		switch {
		case got[j].Err != nil:
		case h.Key != d.Remote.Page || h.Layout != d.Remote.Layout || h.Length != d.Len:
			got[j].Err = &page.CorruptError{Key: d.Remote.Page, Reason: fmt.Sprintf("the transport delivered page %s (%d bytes) for %s (%d bytes)", h.Key, h.Length, d.Remote.Page, d.Len)}
		case got[j].Verified:
		default:
			got[j].Err = h.Verify(d.LocalBytes())
		}
	})
}

// failFetch records a page that did not arrive: a page its holder no longer
// has, or one that arrived corrupt, leaves the remote index (the next
// lookup does not offer it again).
func (s *Store) failFetch(origin int, addr string, it *saveItem, err error, res []Result) {
	c := s.members
	var ce *page.CorruptError
	switch {
	case errors.Is(err, transfer.ErrRemoteNotFound):
		c.Forget(origin, it.key)
		c.NoteFetch("missing", 0)
		res[it.i] = notFound("page %s: no longer held by %s", it.key, addr)
	case errors.As(err, &ce):
		c.Forget(origin, it.key)
		c.NoteFetch("corrupt", 0)
		s.m.corruptPages.Inc()
		res[it.i] = FailResult(fmt.Errorf("fetch from %s: %w", addr, err))
	default:
		c.NoteFetch("failed", 0)
		res[it.i] = FailResult(fmt.Errorf("fetch from %s: %w", addr, err))
	}
	s.freeDRAM(it.slot)
}

// Open serves the data plane: it pins the asked pages this peer holds with
// the asked layout and size (reading SSD-only ones into DRAM, verified),
// seals DRAM pages not yet checksummed, and returns their headers and DRAM
// bytes; release unpins them.
func (s *Store) Open(ctx context.Context, wants []tcp.Want) ([]tcp.Page, func()) {
	res := make([]Result, len(wants))
	items := s.pinWants(wants, false, res)
	s.readFromSSD(ctx, nil, items, res)
	s.sealPinned(items, res)
	pages := make([]tcp.Page, len(wants))
	for _, it := range items {
		if res[it.i].Code != CodePending {
			continue
		}
		pages[it.i] = tcp.Page{Header: header(it.entry), Data: s.pool.Bytes(it.slot)[:it.entry.Size]}
	}
	return pages, func() { s.unpinLoads(items) }
}

// pinWants pins the pages of wants held here with the asked layout and
// size, like pinForLoad, for a member to read (Open, PlaceDRAM); with
// dramOnly, only pages that have a DRAM copy.
func (s *Store) pinWants(wants []tcp.Want, dramOnly bool, res []Result) []*loadItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	items := make([]*loadItem, 0, len(wants))
	for i, w := range wants {
		e, ok := s.cat.Get(w.Key)
		switch {
		case !ok || e.Layout != w.Layout || e.Size != w.Size:
			res[i] = notFound("page %s", w.Key)
		case dramOnly && e.DRAMSlot < 0:
			res[i] = notFound("page %s not in dram", w.Key)
		default:
			it := &loadItem{i: i, req: PageReq{Key: w.Key}, entry: e, tier: e.Tier()}
			s.pinItemLocked(it)
			items = append(items, it)
		}
	}
	return items
}

// sealPinned gives the pinned items read from DRAM and still pending their
// checksums (sealForWrite): a page sent to a member carries its sum.
func (s *Store) sealPinned(items []*loadItem, res []Result) {
	var idx []int
	var entries []catalog.Entry
	for j, it := range items {
		if res[it.i].Code == CodePending && it.tier == catalog.TierDRAM {
			idx, entries = append(idx, j), append(entries, it.entry)
		}
	}
	for k, e := range s.sealForWrite(entries) {
		items[idx[k]].entry.Checksum = e.Checksum
	}
}

// pickUsable returns the lowest holder in h that usable accepts, or -1.
func pickUsable(h catalog.Holders, usable func(int) bool) int {
	for o := h.First(); o >= 0; o = h.Next(o) {
		if usable(o) {
			return o
		}
	}
	return -1
}
