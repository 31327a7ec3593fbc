// Package transporttest holds what tests of transfer.Transport and of its
// users need: Memory, a transport to a remote peer that lives in this
// process; Faulty, a wrapper that drops, delays, reorders or corrupts what
// another transport moves; and Contract, the suite every Transport passes
// (the TCP data plane, Faulty in pass-through, Memory; the RDMA verbs
// transport, over rdma's stand-in libibverbs).
//
// A Faulty transport reports a corrupted Read as completed, unverified: it
// models a transport (or a wire, or a remote memory) that delivers bytes it
// did not check, which the Transport contract allows, so the caller's
// verification is what stands between the bytes and its store.
package transporttest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/transfer"
)

// Memory is a remote peer's pages held in this process, reached as a
// Transport: Read copies a page named by content (transfer.PageKey) into
// the local region, Write stores the local bytes as a page. The endpoint is
// ignored. It is safe for concurrent use.
type Memory struct {
	mu    sync.Mutex
	pages map[pagekey.Key]memPage
	stall chan struct{} // non-nil: Submit waits for ctx's end
}

type memPage struct {
	h    page.Header
	data []byte
}

// NewMemory returns an empty remote.
func NewMemory() *Memory { return &Memory{pages: map[pagekey.Key]memPage{}} }

// Put holds a page at the remote end and returns its key.
func (m *Memory) Put(h page.Header, data []byte) transfer.RemoteKey {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pages[h.Key] = memPage{h: h, data: append([]byte(nil), data...)}
	return transfer.PageKey(h.Key, h.Layout)
}

// Stall makes every later Submit wait for its context's end: a remote that
// stopped answering.
func (m *Memory) Stall() {
	m.mu.Lock()
	m.stall = make(chan struct{})
	m.mu.Unlock()
}

// Name implements transfer.Transport.
func (m *Memory) Name() string { return "memory" }

// Submit implements transfer.Transport.
func (m *Memory) Submit(ctx context.Context, _ string, batch []transfer.RemoteDesc) []transfer.Completion {
	out := make([]transfer.Completion, len(batch))
	m.mu.Lock()
	stall := m.stall
	m.mu.Unlock()
	if stall != nil {
		<-ctx.Done()
	}
	for i, d := range batch {
		if err := ctx.Err(); err != nil {
			out[i].Err = fmt.Errorf("memory transport: %w", err)
			continue
		}
		out[i] = m.one(d)
	}
	return out
}

func (m *Memory) one(d transfer.RemoteDesc) transfer.Completion {
	local := d.LocalBytes()
	if local == nil {
		return transfer.Completion{Err: fmt.Errorf("%w: local region out of range", transfer.ErrUnsupported)}
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	switch d.Op {
	case transfer.Read:
		p, ok := m.pages[d.Remote.Page]
		if !ok || p.h.Layout != d.Remote.Layout || d.RemoteOff > uint64(len(p.data)) || d.Len > uint64(len(p.data))-d.RemoteOff {
			return transfer.Completion{Err: fmt.Errorf("%w: page %s", transfer.ErrRemoteNotFound, d.Remote.Page)}
		}
		copy(local, p.data[d.RemoteOff:])
		return transfer.Completion{Header: p.h}
	case transfer.Write:
		h := page.Header{Key: d.Remote.Page, Layout: d.Remote.Layout, Length: d.Len, Checksum: page.Checksum(local)}
		m.pages[h.Key] = memPage{h: h, data: append([]byte(nil), local...)}
		return transfer.Completion{Header: h}
	}
	return transfer.Completion{Err: fmt.Errorf("%w: op %d", transfer.ErrUnsupported, d.Op)}
}

// Faults says what a Faulty transport does to the batches it passes on.
// The zero value passes everything through unchanged.
type Faults struct {
	// Drop picks descriptors that never complete: each fails when the
	// batch's context ends, with its cause.
	Drop func(i int, d transfer.RemoteDesc) bool
	// Corrupt picks Reads whose bytes get one bit flipped after they
	// completed; they are reported completed.
	Corrupt func(i int, d transfer.RemoteDesc) bool
	// Delay holds each batch this long (bounded by its context) before it
	// goes out.
	Delay time.Duration
	// Reorder sends each batch in an order shuffled by Seed, so that the
	// descriptors complete out of the caller's order.
	Reorder bool
	Seed    uint64
}

// Faulty wraps a Transport with Faults. Its counters say what it did.
type Faulty struct {
	Inner  transfer.Transport
	Faults Faults

	Dropped, Corrupted, Reordered atomic.Int64
}

// All picks every descriptor (for Faults.Drop and Faults.Corrupt).
func All(int, transfer.RemoteDesc) bool { return true }

// Name implements transfer.Transport.
func (f *Faulty) Name() string { return "faulty(" + f.Inner.Name() + ")" }

// Submit implements transfer.Transport.
func (f *Faulty) Submit(ctx context.Context, endpoint string, batch []transfer.RemoteDesc) []transfer.Completion {
	out := make([]transfer.Completion, len(batch))
	if f.Faults.Delay > 0 {
		t := time.NewTimer(f.Faults.Delay)
		select {
		case <-t.C:
		case <-ctx.Done():
		}
		t.Stop()
	}
	var send []int // batch indexes passed on, in the order they go out
	var dropped []int
	for i, d := range batch {
		if f.Faults.Drop != nil && f.Faults.Drop(i, d) {
			dropped = append(dropped, i)
			continue
		}
		send = append(send, i)
	}
	if f.Faults.Reorder && len(send) > 1 {
		rand.New(rand.NewPCG(f.Faults.Seed, uint64(len(send)))).Shuffle(len(send), func(a, b int) { send[a], send[b] = send[b], send[a] })
		f.Reordered.Add(1)
	}
	inner := make([]transfer.RemoteDesc, len(send))
	for j, i := range send {
		inner[j] = batch[i]
	}
	if len(inner) > 0 {
		for j, c := range f.Inner.Submit(ctx, endpoint, inner) {
			i := send[j]
			out[i] = c
			if c.Err == nil && batch[i].Op == transfer.Read && f.Faults.Corrupt != nil && f.Faults.Corrupt(i, batch[i]) {
				if b := batch[i].LocalBytes(); len(b) > 0 {
					b[len(b)/2] ^= 0x10
					out[i].Verified = false // corrupted after whatever the inner transport checked
					f.Corrupted.Add(1)
				}
			}
		}
	}
	if len(dropped) > 0 {
		<-ctx.Done() // a dropped descriptor never completes: the deadline ends it
		for _, i := range dropped {
			out[i].Err = fmt.Errorf("dropped by the fake transport: %w", context.Cause(ctx))
			f.Dropped.Add(1)
		}
	}
	return out
}
