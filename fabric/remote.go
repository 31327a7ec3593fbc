package fabric

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// Remote pages: a load names pages this peer does not hold but a member
// announced; they are fetched over the data plane into fresh DRAM slots,
// verified on receipt, recorded in the catalog as this peer's own (so the
// load, and later lookups, find them here) and then loaded like any DRAM
// page. The other way, Open serves this peer's pages to members.

// fetchRemote fetches the pages of reqs that no local tier holds and a live
// member announced with the session's layout. A page that cannot be fetched
// fails its request here, with the reason; the others are left to the load.
func (s *pageStore) fetchRemote(ctx context.Context, sess *session, reqs []pageReq, res []pageResult) {
	c := s.cluster
	if c == nil {
		return
	}
	byOrigin := map[int][]int{}
	prev := -1
	for i, r := range reqs {
		if res[i].Code != codePending {
			continue
		}
		if _, ok := s.cat.Get(r.Key); ok {
			continue
		}
		p, ok := c.Remote(r.Key)
		if !ok || p.Layout != sess.fp || p.Size != sess.pageBytes {
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
	var wg sync.WaitGroup
	for o, idx := range byOrigin {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s.fetchFrom(ctx, sess, o, reqs, idx, res)
		}()
	}
	wg.Wait()
}

// fetchFrom fetches reqs[idx] from one member and commits what arrived.
func (s *pageStore) fetchFrom(ctx context.Context, sess *session, origin int, reqs []pageReq, idx []int, res []pageResult) {
	c := s.cluster
	addr, ok := c.DataAddr(origin)
	if !ok {
		for _, i := range idx {
			c.Forget(origin, reqs[i].Key)
			res[i] = notFound("page %s: its holder left the cluster", reqs[i].Key)
		}
		return
	}
	wants := make([]tcp.Want, 0, len(idx))
	dst := make([][]byte, 0, len(idx))
	items := make([]*saveItem, 0, len(idx))
	for _, i := range idx {
		slot, err := s.allocDRAM(ctx, sess.pageBytes)
		if err != nil {
			res[i] = failResult(fmt.Errorf("dram slot for a remote page: %w", err))
			continue
		}
		wants = append(wants, tcp.Want{Key: reqs[i].Key, Layout: sess.fp, Size: sess.pageBytes})
		dst = append(dst, s.pool.Bytes(slot)[:sess.pageBytes])
		items = append(items, &saveItem{i: i, key: reqs[i].Key, slot: slot})
	}
	if len(wants) == 0 {
		return
	}
	s.m.inflight.Inc()
	got := c.Fetch(ctx, addr, wants, dst)
	s.m.inflight.Dec()
	var arrived []*saveItem
	for j, it := range items {
		if err := got[j].Err; err != nil {
			s.failFetch(origin, addr, it, err, res)
			continue
		}
		h := got[j].Header
		clear(s.pool.Bytes(it.slot)[h.Length:]) // as a save leaves the padding
		it.entry = catalog.Entry{Key: h.Key, Layout: h.Layout, Size: h.Length, Checksum: h.Checksum,
			Generation: s.nextGen(), DRAMSlot: int64(it.slot), LastAccess: now()}
		arrived = append(arrived, it)
		c.NoteFetch("ok", h.Length)
	}
	// commitSaves reports into its own results: the load's stay pending.
	scratch := make([]pageResult, len(reqs))
	s.commitSaves(arrived, scratch)
	for _, it := range arrived {
		if scratch[it.i].Code != codeOK {
			res[it.i] = scratch[it.i]
		}
	}
}

// failFetch records a page that did not arrive: a page its holder no longer
// has, or one that arrived corrupt, leaves the remote index (the next
// lookup does not offer it again).
func (s *pageStore) failFetch(origin int, addr string, it *saveItem, err error, res []pageResult) {
	c := s.cluster
	var ce *page.CorruptError
	switch {
	case errors.Is(err, tcp.ErrNotFound):
		c.Forget(origin, it.key)
		c.NoteFetch("missing", 0)
		res[it.i] = notFound("page %s: no longer held by %s", it.key, addr)
	case errors.As(err, &ce):
		c.Forget(origin, it.key)
		c.NoteFetch("corrupt", 0)
		s.m.corruptPages.Inc()
		res[it.i] = failResult(fmt.Errorf("fetch from %s: %w", addr, err))
	default:
		c.NoteFetch("failed", 0)
		res[it.i] = failResult(fmt.Errorf("fetch from %s: %w", addr, err))
	}
	s.freeDRAM(it.slot)
}

// Open serves the data plane: it pins the asked pages this peer holds with
// the asked layout and size (reading SSD-only ones into DRAM, verified),
// seals DRAM pages not yet checksummed, and returns their headers and DRAM
// bytes; release unpins them.
func (s *pageStore) Open(ctx context.Context, wants []tcp.Want) ([]tcp.Page, func()) {
	res := make([]pageResult, len(wants))
	items := s.pinForServe(wants, res)
	s.readFromSSD(ctx, nil, items, res)
	var dramIdx []int
	var entries []catalog.Entry
	for j, it := range items {
		if res[it.i].Code == codePending && it.tier == catalog.TierDRAM {
			dramIdx, entries = append(dramIdx, j), append(entries, it.entry)
		}
	}
	for k, e := range s.sealForWrite(entries) {
		items[dramIdx[k]].entry.Checksum = e.Checksum
	}
	pages := make([]tcp.Page, len(wants))
	for _, it := range items {
		if res[it.i].Code != codePending {
			continue
		}
		pages[it.i] = tcp.Page{Header: header(it.entry), Data: s.pool.Bytes(it.slot)[:it.entry.Size]}
	}
	return pages, func() { s.unpinLoads(items) }
}

// pinForServe pins the pages of wants held here as asked, like pinForLoad.
func (s *pageStore) pinForServe(wants []tcp.Want, res []pageResult) []*loadItem {
	s.mu.Lock()
	defer s.mu.Unlock()
	items := make([]*loadItem, 0, len(wants))
	for i, w := range wants {
		e, ok := s.cat.Get(w.Key)
		if !ok || e.Layout != w.Layout || e.Size != w.Size {
			res[i] = notFound("page %s", w.Key)
			continue
		}
		it := &loadItem{i: i, req: pageReq{Key: w.Key}, entry: e, tier: e.Tier()}
		s.pinItemLocked(it)
		items = append(items, it)
	}
	return items
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
