package tiers

import (
	"math"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// LRU orders the pages of one tier by last use and hands out eviction
// victims, oldest first, skipping pinned pages. A page is pinned while a
// lease or a copy needs it to stay where it is.
//
// A segmented LRU (NewSegmentedLRU) keeps two such orders: pages enter a
// probationary segment, and only a page used again (Promote: restored into
// an engine, or saved anew after it had left the tier) moves to the
// protected one, which holds at most a set share of the pages (its oldest
// go back to the probationary segment's newest end). Victims come from the
// probationary segment first. So a stream of pages saved once and never
// asked for again — a quarter of the seeds' workload, new prefixes — evicts
// its own kind and not the prefixes that keep coming back, which a single
// LRU gives up to whatever was saved last.
//
// LRU is not safe for concurrent use; its owner serializes access.
type LRU struct {
	nodes map[pagekey.Key]*lruNode
	head  lruNode // probationary (the only segment of a plain LRU): head.next is the oldest, head.prev the newest
	prot  lruNode // protected segment, the same way round
	nProt int     // pages in the protected segment
	share float64 // the protected segment's cap when evicting, a share of all pages (0: a plain LRU)
}

type lruNode struct {
	key        pagekey.Key
	pins       int
	protected  bool
	prev, next *lruNode
}

// DRAMProtectedShare is the share of the DRAM tier's pages that pages used
// again (restored, promoted or readmitted) may hold against pages saved
// once: the peer's DRAM order (fabric/store), and the sim's.
const DRAMProtectedShare = 0.8

// NewLRU returns an empty plain LRU: Promote is Touch.
func NewLRU() *LRU { return NewSegmentedLRU(0) }

// NewSegmentedLRU returns an empty segmented LRU whose protected segment
// holds at most share (0 < share < 1) of the pages whenever a victim is
// picked (a tier still filling up protects all it restores); share 0 is
// NewLRU.
func NewSegmentedLRU(share float64) *LRU {
	if math.IsNaN(share) {
		share = 0
	}
	l := &LRU{nodes: make(map[pagekey.Key]*lruNode), share: max(0, min(share, 1))}
	l.head.prev, l.head.next = &l.head, &l.head
	l.prot.prev, l.prot.next = &l.prot, &l.prot
	return l
}

// Len returns the number of tracked pages.
func (l *LRU) Len() int { return len(l.nodes) }

// Contains reports whether k is tracked.
func (l *LRU) Contains(k pagekey.Key) bool { _, ok := l.nodes[k]; return ok }

// Touch marks k as the newest page of its segment, adding it to the
// probationary segment if absent.
func (l *LRU) Touch(k pagekey.Key) {
	n, ok := l.nodes[k]
	if ok {
		n.unlink()
	} else {
		n = l.add(k)
	}
	n.linkBefore(l.segment(n))
}

func (l *LRU) add(k pagekey.Key) *lruNode {
	n := &lruNode{key: k}
	l.nodes[k] = n
	return n
}

// Promote marks k as used again: the newest page of the protected segment
// (of a plain LRU: Touch), adding it if absent.
func (l *LRU) Promote(k pagekey.Key) {
	if l.share == 0 {
		l.Touch(k)
		return
	}
	n, ok := l.nodes[k]
	if ok {
		n.unlink()
		l.leave(n)
	} else {
		n = l.add(k)
	}
	n.protected = true
	l.nProt++
	n.linkBefore(&l.prot)
}

// rebalance hands the protected segment's oldest pages back to the
// probationary segment's newest end while it holds more than its share.
func (l *LRU) rebalance() {
	for l.nProt > 0 && float64(l.nProt) > l.share*float64(len(l.nodes)) {
		old := l.prot.next
		old.unlink()
		l.leave(old)
		old.linkBefore(&l.head)
	}
}

// Protected reports whether k is in the protected segment.
func (l *LRU) Protected(k pagekey.Key) bool {
	n, ok := l.nodes[k]
	return ok && n.protected
}

func (l *LRU) segment(n *lruNode) *lruNode {
	if n.protected {
		return &l.prot
	}
	return &l.head
}

// leave accounts for n, unlinked, leaving the protected segment.
func (l *LRU) leave(n *lruNode) {
	if n.protected {
		n.protected = false
		l.nProt--
	}
}

// Remove stops tracking k, pinned or not.
func (l *LRU) Remove(k pagekey.Key) {
	if n, ok := l.nodes[k]; ok {
		n.unlink()
		l.leave(n)
		delete(l.nodes, k)
	}
}

// Pin keeps k from being a victim until a matching Unpin. It reports false
// when k is not tracked.
func (l *LRU) Pin(k pagekey.Key) bool {
	n, ok := l.nodes[k]
	if ok {
		n.pins++
	}
	return ok
}

// Unpin undoes one Pin.
func (l *LRU) Unpin(k pagekey.Key) {
	if n, ok := l.nodes[k]; ok && n.pins > 0 {
		n.pins--
	}
}

// Pinned reports whether k has pins.
func (l *LRU) Pinned(k pagekey.Key) bool {
	n, ok := l.nodes[k]
	return ok && n.pins > 0
}

// Pins returns k's pin count.
func (l *LRU) Pins(k pagekey.Key) int {
	if n, ok := l.nodes[k]; ok {
		return n.pins
	}
	return 0
}

// Victim returns the least recently used unpinned page, probationary pages
// first, or false when every tracked page is pinned. It does not remove the
// page; a protected segment over its share first hands its oldest pages
// back to the probationary one.
func (l *LRU) Victim() (pagekey.Key, bool) {
	for k := range l.Oldest(math.MaxInt) {
		return k, true
	}
	return pagekey.Key{}, false
}

// Oldest yields up to n of the oldest unpinned pages of each segment, in
// the order Victim would pick them: the probationary segment's, then the
// protected one's (a plain LRU has only the first). It balances the
// segments first, as Victim does. The LRU must not change while it runs.
func (l *LRU) Oldest(n int) func(yield func(pagekey.Key) bool) {
	return func(yield func(pagekey.Key) bool) {
		if l.share > 0 {
			l.rebalance()
		}
		for _, head := range [...]*lruNode{&l.head, &l.prot} {
			left := n
			for p := head.next; p != head && left > 0; p = p.next {
				if p.pins > 0 {
					continue
				}
				if !yield(p.key) {
					return
				}
				left--
			}
		}
	}
}

func (n *lruNode) unlink() {
	n.prev.next, n.next.prev = n.next, n.prev
	n.prev, n.next = nil, nil
}

func (n *lruNode) linkBefore(at *lruNode) {
	n.prev, n.next = at.prev, at
	at.prev.next = n
	at.prev = n
}
