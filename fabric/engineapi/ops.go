package engineapi

import (
	"context"
	"errors"
	"fmt"
	"github.com/orbitkv/orbitkv/fabric/store"
	"sync/atomic"
	"time"
)

// op is an asynchronous Save or Load; results are filled by its goroutine
// (or, for a call that waits, by the call's) and read only after done is
// closed.
type op struct {
	id      string
	sess    *session
	results []store.Result
	done    chan struct{}
	doneAt  atomic.Int64 // unix nanoseconds, set before done is closed
}

// opRetention is how long a finished operation waits for its Wait before
// the peer forgets it.
const opRetention = 5 * time.Minute

// errTooManyOps reports a session at Limits.MaxUnwaitedOps.
var errTooManyOps = errors.New("too many operations not yet waited for")

// startOp runs fn in a goroutine owned by the session (and the peer), with a
// deadline, and registers it for Wait. With a caller context (a Save or
// Load that waits) it runs fn on the caller's goroutine instead, returns
// once it is done, and ends it early when the caller goes: its deadline is
// the caller's less inlineMargin, so the answer leaves before the caller
// stops listening, and no copy of it keeps running after the call.

func (p *API) startOp(sess *session, n int, deadline time.Duration, caller context.Context, fn func(ctx context.Context, res []store.Result)) (*op, error) {
	inline := caller != nil
	if err := sess.begin(); err != nil {
		return nil, err
	}
	o := &op{id: newID("op-"), sess: sess, results: make([]store.Result, n), done: make(chan struct{})}
	sess.mu.Lock()
	if limit := p.cfg.maxOps(); len(sess.mu.ops) >= limit {
		sess.mu.Unlock()
		sess.work.Done()
		return nil, fmt.Errorf("%w: session %s has %d; call Wait", errTooManyOps, sess.id, limit)
	}
	sess.mu.ops[o.id] = o
	sess.mu.Unlock()
	p.m.inflightOps.Inc()
	runOp := func() {
		defer sess.work.Done()
		defer p.m.inflightOps.Dec()
		defer close(o.done)
		defer func() { o.doneAt.Store(p.now().UnixNano()) }()
		ctx, cancel := context.WithTimeout(sess.ctx, deadline)
		defer cancel()
		if inline { // the caller waits: the op ends before the call does
			if dl, ok := caller.Deadline(); ok {
				ctx, cancel = context.WithDeadline(ctx, dl.Add(-inlineMargin))
				defer cancel()
			}
			defer context.AfterFunc(caller, cancel)()
		}
		fn(ctx, o.results)
		for i := range o.results {
			if o.results[i].Code == store.CodePending {
				o.results[i] = store.FailResult(fmt.Errorf("not started: %w", context.Cause(ctx)))
			}
		}
		p.pages.UpdateGauges()
	}
	if inline {
		runOp()
	} else {
		go runOp()
	}
	return o, nil
}

// inlineMargin is how long before its caller's deadline a waiting call's
// operation ends, leaving time to answer.
const inlineMargin = 50 * time.Millisecond

// forgetOp drops a finished operation whose status its caller has (a Save
// or Load that waited).
func (p *API) forgetOp(sess *session, id string) {
	sess.mu.Lock()
	delete(sess.mu.ops, id)
	sess.mu.Unlock()
}

// waitOp waits up to timeout for an operation. A finished operation is
// forgotten once its results are returned.
func (p *API) waitOp(ctx context.Context, sess *session, id string, timeout time.Duration) (*op, bool, error) {
	sess.mu.Lock()
	o, ok := sess.mu.ops[id]
	sess.mu.Unlock()
	if !ok {
		return nil, false, fmt.Errorf("%w: unknown operation %q", store.ErrNotFound, id)
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-o.done:
	case <-t.C:
		return o, false, nil
	case <-ctx.Done():
		return o, false, nil
	}
	sess.mu.Lock()
	delete(sess.mu.ops, id)
	sess.mu.Unlock()
	return o, true, nil
}

// forgetStaleOps drops finished operations nobody waited for within
// opRetention, so an engine that never calls Wait cannot grow the peer.
func (s *session) forgetStaleOps(now time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for id, o := range s.mu.ops {
		if t := o.doneAt.Load(); t != 0 && now.Sub(time.Unix(0, t)) > opRetention {
			delete(s.mu.ops, id)
		}
	}
}
