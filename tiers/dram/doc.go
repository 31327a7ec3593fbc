// Package dram is the peer's DRAM tier: one pool of host memory allocated at
// start, aligned to page.Alignment and pre-faulted (first touch of fresh
// memory is slow in VMs, so it is paid at start, never on a save), carved
// into page slots.
//
// The pool is split into slabs; a slab is bound to one slot size on first use
// (one size per layout, so several layouts can share a pool) and returns to
// the free list when its last slot is freed. A slot's bytes stay valid until
// Free; the pool never moves or reuses a slot that is allocated. Who may
// touch a slot and when is the caller's protocol (the peer pins a page for
// every copy in flight and frees a slot only after the catalog stopped naming
// it).
//
// The whole pool is one Region so transports can register it once (CUDA
// pinning, RDMA memory registration).
package dram
