package ssd

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"syscall"
	"unsafe"

	"github.com/pawelgaczynski/giouring"
	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
)

type opKind uint8

const (
	opRead opKind = iota
	opWrite
	opSync
)

// op is one submitted operation. Between submit and its arrival on done the
// kernel owns iov, the buffers it points to and the slot's header block.
type op struct {
	kind opKind
	file File // the page file, told of the op at its Points (fs.go)
	fd   int
	off  uint64
	iov  [2]unix.Iovec
	niov int
	want int64 // bytes the op must transfer
	req  int   // index of the request it serves
	slot int
	res  int32
	done chan *op
}

// stopData is the user data of the NOP that tells the reaper to exit.
const stopData = ^uint64(0)

// uring drives one io_uring. Submitters share the submission queue under
// mu; one goroutine, the reaper, owns the completion queue. A slot (an
// index in 0..depth) is a ticket for one op in flight, with its own
// header block; holding a slot is what bounds the ops in flight to depth,
// so the completion queue (twice the submission queue) never overflows.
type uring struct {
	mu struct {
		sync.Mutex
		ring *giouring.Ring
		ops  []*op // by slot
		dead error
	}
	free     chan int // free slots
	headers  []byte   // depth header blocks, page.Alignment-aligned
	inFlight atomic.Int64
	reaped   chan struct{} // closed when the reaper exits
}

func newURing(depth int) (*uring, error) {
	ring, err := giouring.CreateRing(uint32(depth))
	if err != nil {
		return nil, fmt.Errorf("create io_uring with %d entries: %w", depth, err)
	}
	u := &uring{free: make(chan int, depth), headers: alignedBytes(depth * page.HeaderSize),
		reaped: make(chan struct{})}
	u.mu.ring, u.mu.ops = ring, make([]*op, depth)
	for i := range depth {
		u.free <- i
	}
	go u.reap()
	return u, nil
}

// header returns the header block of a slot.
func (u *uring) header(slot int) []byte {
	return u.headers[slot*page.HeaderSize : (slot+1)*page.HeaderSize]
}

// submit queues ops, each holding a slot, with one io_uring_enter. Every op
// arrives on its done channel exactly once, with -EIO if the ring broke.
func (u *uring) submit(ops []*op) {
	u.mu.Lock()
	if u.mu.dead != nil {
		u.mu.Unlock()
		deliver(ops, -int32(syscall.EIO))
		return
	}
	u.queueLocked(ops)
	if err := u.flushLocked(); err != nil {
		// A failed io_uring_enter consumed none of these entries, and the
		// dead ring submits nothing more, so only this call's ops fail now;
		// ops of earlier calls are the kernel's and still complete through
		// the reaper, which keeps their buffers owned until then.
		u.mu.dead = err
		for _, o := range ops {
			if u.mu.ops[o.slot] == o {
				u.mu.ops[o.slot] = nil
				u.inFlight.Add(-1)
			}
		}
		u.mu.Unlock()
		deliver(ops, -int32(syscall.EIO))
		return
	}
	u.mu.Unlock()
}

func (u *uring) queueLocked(ops []*op) {
	for _, o := range ops {
		sqe := u.mu.ring.GetSQE()
		if sqe == nil { // cannot happen: slots bound the ops in flight
			panic("ssd: io_uring submission queue full")
		}
		o.prepare(sqe)
		u.mu.ops[o.slot] = o
	}
	u.inFlight.Add(int64(len(ops)))
}

// flushLocked hands the prepared entries to the kernel, retrying EINTR.
func (u *uring) flushLocked() error {
	for {
		_, err := u.mu.ring.Submit()
		switch {
		case err == nil:
			return nil
		case !errors.Is(err, syscall.EINTR) && !errors.Is(err, syscall.EAGAIN):
			return fmt.Errorf("io_uring submit: %w", err)
		}
	}
}

// drainLocked empties the op table of a broken ring.
func (u *uring) drainLocked() []*op {
	var ops []*op
	for i, o := range u.mu.ops {
		if o != nil {
			ops = append(ops, o)
			u.mu.ops[i] = nil
			u.inFlight.Add(-1)
		}
	}
	return ops
}

func deliver(ops []*op, res int32) {
	for _, o := range ops {
		o.res = res
		o.done <- o
	}
}

// prepare fills sqe for o. giouring's prepare helpers leave some fields
// (rw_flags among them) as the entry's previous user set them, so the
// entry is cleared first: a stale FsyncDatasync reads as RWF_HIPRI.
func (o *op) prepare(sqe *giouring.SubmissionQueueEntry) {
	*sqe = giouring.SubmissionQueueEntry{}
	iov := uintptr(unsafe.Pointer(&o.iov[0]))
	switch o.kind {
	case opRead:
		sqe.PrepareReadv(o.fd, iov, uint32(o.niov), o.off)
	case opWrite:
		sqe.PrepareWritev(o.fd, iov, uint32(o.niov), o.off)
	case opSync:
		sqe.PrepareFsync(o.fd, giouring.FsyncDatasync)
	}
	sqe.SetData64(uint64(o.slot))
}

// reap delivers completions until it reaps the stop NOP.
func (u *uring) reap() {
	defer close(u.reaped)
	ring := u.ringUnlocked()
	for {
		cqe, err := ring.WaitCQE()
		if errors.Is(err, syscall.EINTR) || errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.ETIME) {
			continue
		}
		if err != nil {
			u.fail(fmt.Errorf("io_uring wait: %w", err))
			return
		}
		data, res := cqe.UserData, cqe.Res
		ring.CQESeen(cqe)
		if data == stopData {
			return
		}
		u.complete(int(data), res)
	}
}

// ringUnlocked returns the ring pointer, which never changes after newURing.
func (u *uring) ringUnlocked() *giouring.Ring {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.mu.ring
}

func (u *uring) complete(slot int, res int32) {
	u.mu.Lock()
	o := u.mu.ops[slot]
	u.mu.ops[slot] = nil
	u.mu.Unlock()
	if o == nil { // already failed by a broken ring
		return
	}
	u.inFlight.Add(-1)
	deliver([]*op{o}, res)
}

// fail breaks the ring: every op in flight ends with -EIO.
func (u *uring) fail(err error) {
	u.mu.Lock()
	u.mu.dead = err
	ops := u.drainLocked()
	u.mu.Unlock()
	deliver(ops, -int32(syscall.EIO))
}

// close stops the reaper and releases the ring. No op may be in flight. A
// broken ring is left mapped: the reaper may still be blocked on it.
func (u *uring) close() {
	u.mu.Lock()
	if u.mu.dead == nil {
		sqe := u.mu.ring.GetSQE()
		*sqe = giouring.SubmissionQueueEntry{}
		sqe.PrepareNop()
		sqe.SetData64(stopData)
		if err := u.flushLocked(); err != nil {
			u.mu.dead = err
		}
	}
	dead := u.mu.dead
	u.mu.Unlock()
	if dead != nil {
		return
	}
	<-u.reaped
	u.mu.Lock()
	defer u.mu.Unlock()
	u.mu.ring.QueueExit()
}

// alignedBytes returns n zeroed bytes at a page.Alignment-aligned address.
func alignedBytes(n int) []byte {
	b := make([]byte, n+page.Alignment)
	skip := (page.Alignment - int(uintptr(unsafe.Pointer(&b[0]))%page.Alignment)) % page.Alignment
	return b[skip : skip+n : skip+n]
}
