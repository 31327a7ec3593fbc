package tiers

import "github.com/orbitkv/orbitkv/internal/pagekey"

// LRU orders the pages of one tier by last use and hands out eviction
// victims, oldest first, skipping pinned pages. A page is pinned while a
// lease or a copy needs it to stay where it is.
//
// LRU is not safe for concurrent use; its owner serializes access.
type LRU struct {
	nodes map[pagekey.Key]*lruNode
	head  lruNode // sentinel: head.next is the oldest, head.prev the newest
}

type lruNode struct {
	key        pagekey.Key
	pins       int
	prev, next *lruNode
}

// NewLRU returns an empty LRU.
func NewLRU() *LRU {
	l := &LRU{nodes: make(map[pagekey.Key]*lruNode)}
	l.head.prev, l.head.next = &l.head, &l.head
	return l
}

// Len returns the number of tracked pages.
func (l *LRU) Len() int { return len(l.nodes) }

// Contains reports whether k is tracked.
func (l *LRU) Contains(k pagekey.Key) bool { _, ok := l.nodes[k]; return ok }

// Touch marks k as the newest page, adding it if absent.
func (l *LRU) Touch(k pagekey.Key) {
	n, ok := l.nodes[k]
	if ok {
		n.unlink()
	} else {
		n = &lruNode{key: k}
		l.nodes[k] = n
	}
	n.linkBefore(&l.head)
}

// Remove stops tracking k, pinned or not.
func (l *LRU) Remove(k pagekey.Key) {
	if n, ok := l.nodes[k]; ok {
		n.unlink()
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

// Victim returns the least recently used unpinned page, or false when every
// tracked page is pinned. It does not remove the page.
func (l *LRU) Victim() (pagekey.Key, bool) {
	for n := l.head.next; n != &l.head; n = n.next {
		if n.pins == 0 {
			return n.key, true
		}
	}
	return pagekey.Key{}, false
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
