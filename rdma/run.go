package rdma

import (
	"context"
	"fmt"
	"runtime"
	"time"
)

// Read copies each op's remote range into its local segments (RDMA READ,
// scattered). It returns one error per op (nil: every byte arrived) when
// every op has finished or failed. It never returns while a NIC may still
// write into the destination: work requests still in flight at the
// deadline are flushed and drained first (or their QP destroyed).
func (c *Conn) Read(ctx context.Context, ops []Op) []error { return c.do(ctx, opRead, ops) }

// Write copies each op's local segments into its remote range (RDMA WRITE,
// gathered), with Read's guarantees.
func (c *Conn) Write(ctx context.Context, ops []Op) []error { return c.do(ctx, opWrite, ops) }

func (c *Conn) do(ctx context.Context, op opcode, ops []Op) []error {
	if _, ok := ctx.Deadline(); !ok { // never wait without a deadline
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.e.cfg.Timeout)
		defer cancel()
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return fill(len(ops), ErrClosed)
	}
	if err := c.recoverLocked(ctx); err != nil && !c.anyUp() {
		return fill(len(ops), fmt.Errorf("%w: %w", ErrLaneDown, err))
	}
	slices, errs := planSlices(ops, c.remote, c.e.cfg.SliceBytes, c.e.cfg.MaxSGE)
	c.gen++
	dl, _ := ctx.Deadline()
	b := &batch{c: c, op: op, gen: c.gen & (1<<32 - 1), slices: slices, errs: errs, left: make([]int, len(ops)), drainBy: dl}
	for _, s := range slices {
		b.left[s.op]++
	}
	rctx, cancel := context.WithDeadline(ctx, dl.Add(-drainReserve(time.Until(dl), c.e.cfg.DrainTimeout)))
	defer cancel()
	b.run(rctx)
	c.e.stats.count(op, ops, b.errs)
	return b.errs
}

// drainReserve is how much of a batch's remaining time is kept for the
// drain after its work is cut off: DrainTimeout, or a quarter of what is
// left when that is less, so that cut-off, drain and destroy all end by the
// caller's deadline (its answer is due then, not DrainTimeout later).
func drainReserve(left, drain time.Duration) time.Duration {
	return max(0, min(drain, left/4))
}

func (c *Conn) anyUp() bool {
	for _, l := range c.lanes {
		if l.state == laneUp {
			return true
		}
	}
	return false
}

func fill(n int, err error) []error {
	out := make([]error, n)
	for i := range out {
		out[i] = err
	}
	return out
}

// batch is one Read or Write in flight: slices queued per lane, completions
// matched back to ops by work request ID (the slice index), in any order.
type batch struct {
	c        *Conn
	op       opcode
	slices   []wrSlice
	errs     []error   // per op
	left     []int     // per op: slices not yet completed
	queue    [][]int   // per lane: slice indexes waiting to be posted
	next     int       // round-robin cursor
	gen      uint64    // the Conn's batch number, in every work request ID
	draining bool      // past the deadline: completions are only counted
	drainBy  time.Time // the caller's deadline: the drain ends by it
	open     int       // slices not yet finished (completed or failed)
}

func (b *batch) run(ctx context.Context) {
	b.queue = make([][]int, len(b.c.lanes))
	for i := range b.slices {
		b.open++
		b.enqueue(i, -1)
	}
	wc := make([]completion, 64)
	for iter := 1; b.open > 0 || b.inflight() > 0; iter++ {
		b.post()
		n := b.poll(wc)
		if iter%64 == 0 && ctx.Err() != nil { // also while completions keep coming
			b.timeout(ctx)
			return
		}
		if n == 0 {
			runtime.Gosched()
		}
	}
}

// enqueue puts slice i on the next usable lane (not avoid, if another is
// usable) or fails its op when no lane is usable.
func (b *batch) enqueue(i, avoid int) {
	usable := make([]bool, len(b.c.lanes))
	for j, l := range b.c.lanes {
		usable[j] = l.state == laneUp
	}
	j := pickLane(usable, b.next, avoid)
	if j < 0 {
		err := error(ErrLaneDown)
		if last := b.slices[i].lastErr; last != nil { // say why it needed another lane
			err = fmt.Errorf("%w, and %w to retry on", last, ErrLaneDown)
		}
		b.fail(i, err)
		return
	}
	b.next = j
	b.queue[j] = append(b.queue[j], i)
}

func (b *batch) fail(i int, err error) {
	s := &b.slices[i]
	if b.errs[s.op] == nil {
		b.errs[s.op] = err
	}
	b.open--
}

func (b *batch) inflight() int {
	n := 0
	for _, l := range b.c.lanes {
		n += l.inflight
	}
	return n
}

// post fills every up lane's send queue from its slice queue.
func (b *batch) post() {
	depth := b.c.e.cfg.SendDepth
	for j, l := range b.c.lanes {
		q := b.queue[j]
		if len(q) > 0 && l.state != laneUp { // the lane broke after these were queued
			b.queue[j] = nil
			for _, si := range q {
				b.enqueue(si, j)
			}
			continue
		}
		if len(q) == 0 || l.inflight >= depth {
			continue
		}
		n := min(len(q), depth-l.inflight)
		wrs := make([]sendWR, n)
		for k, si := range q[:n] {
			wrs[k] = b.workRequest(si, l)
		}
		posted, err := b.c.e.v.postSend(l.qp, wrs)
		l.inflight += posted
		b.queue[j] = q[posted:]
		if err != nil { // the QP refuses work: requeue the rest elsewhere
			l.state = laneBroken
			rest := b.queue[j]
			b.queue[j] = nil
			for _, si := range rest {
				b.enqueue(si, j)
			}
		}
	}
}

func (b *batch) workRequest(si int, l *lane) sendWR {
	s := &b.slices[si]
	s.lane = l.idx
	r := b.c.remote[s.remote]
	wr := sendWR{ID: b.gen<<32 | uint64(si), Op: b.op, RemoteAddr: r.Addr + s.remoteOff, RKey: r.RKeys[l.idx], SGEs: make([]sge, len(s.segs))}
	for k, g := range s.segs {
		wr.SGEs[k] = sge{Addr: g.Region.Addr + g.Off, Len: uint32(g.Len), LKey: g.Region.mrs[l.nicIdx].LKey}
	}
	return wr
}

// poll drains every lane's CQ once and returns the completions seen.
func (b *batch) poll(wc []completion) int {
	seen := 0
	for _, l := range b.c.lanes {
		if l.inflight == 0 {
			continue
		}
		n, err := b.c.e.v.pollCQ(l.cq, wc)
		if err != nil {
			l.state = laneBroken // a CQ that cannot be polled: drained at the deadline
			continue
		}
		for _, w := range wc[:n] {
			b.complete(l, w)
		}
		seen += n
	}
	return seen
}

func (b *batch) complete(l *lane, w completion) {
	si := int(w.ID & (1<<32 - 1))
	if w.ID>>32 == b.gen {
		l.inflight--
	}
	if w.ID>>32 != b.gen || si >= len(b.slices) {
		return // a stale completion of an earlier batch (cannot happen: each drains or destroys its CQ)
	}
	s := &b.slices[si]
	if w.Status == WCSuccess {
		l.failures = 0
		b.left[s.op]--
		b.open--
		return
	}
	// The QP is in ERR now (the hardware moved it); everything else it
	// holds comes back flushed. A flushed slice did not fail on its own
	// account and is requeued freely; one that failed is retried on
	// another lane up to Config.Retries times.
	l.state = laneBroken
	if b.draining { // the batch is over: its unfinished ops fail with ErrTimeout
		return
	}
	if w.Status != WCFlushErr {
		b.c.e.stats.errCompletions.Add(1)
		s.tries++
		s.lastErr = &CompletionError{Device: l.nic.info.Name, Status: w.Status, VendorErr: w.VendorErr}
	}
	if s.tries > max(0, b.c.e.cfg.Retries) || b.errs[s.op] != nil {
		b.fail(si, cmpOrErr(s.lastErr, &CompletionError{Device: l.nic.info.Name, Status: w.Status, VendorErr: w.VendorErr}))
		return
	}
	b.enqueue(si, l.idx)
}

// timeout ends a batch at its deadline: every lane with work in flight is
// moved to ERR so the NIC flushes it, the flushes are drained (bounded by
// Config.DrainTimeout and by the caller's deadline), and a lane that still
// will not drain has its QP destroyed, after which the NIC touches none of
// its buffers.
func (b *batch) timeout(ctx context.Context) {
	for _, l := range b.c.lanes {
		if l.inflight > 0 {
			l.state = laneBroken
			b.c.e.v.modifyQP(l.qp, qpAttr{State: QPErr}) // best effort: destroy below if it does not drain
		}
	}
	b.draining = true
	b.c.e.stats.timeouts.Add(1)
	drainBy := time.Now().Add(b.c.e.cfg.DrainTimeout)
	if b.drainBy.Before(drainBy) {
		drainBy = b.drainBy
	}
	wc := make([]completion, 64)
	for b.inflight() > 0 && time.Now().Before(drainBy) {
		if b.poll(wc) == 0 {
			runtime.Gosched()
		}
	}
	for _, l := range b.c.lanes {
		if l.inflight > 0 {
			b.c.e.stats.qpsLost.Add(1)
			b.c.e.v.destroyQP(l.qp)
			b.c.e.v.destroyCQ(l.cq)
			l.qp, l.cq, l.inflight = 0, 0, 0
		}
	}
	err := fmt.Errorf("%w: %w", ErrTimeout, context.Cause(ctx))
	for op, n := range b.left {
		if n > 0 && b.errs[op] == nil {
			b.errs[op] = err
		}
	}
}

func cmpOrErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
