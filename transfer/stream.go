package transfer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/orbitkv/orbitkv/cuda"
)

// CopyStream is one device copy fed in parts: each Add is enqueued at once
// behind the parts before it, so the caller plans part k+1 while part k
// copies, and the copy starts after the first few pages are planned rather
// than all of them. Finish waits for everything and must be called exactly
// once after Begin succeeded, whatever Add returned. Not safe for
// concurrent use.
type CopyStream interface {
	// Add enqueues batch; the descriptors are not used after it returns.
	// After an error the stream takes nothing more (Finish still waits).
	Add(batch []Desc) error
	// Finish waits until every part added is in place (or failed) and
	// returns the first error of the stream.
	Finish(ctx context.Context) error
}

// Begin takes a copier for a stream of parts.
func (c *CUDA) Begin(ctx context.Context) (CopyStream, error) {
	slot, err := c.acquire(ctx)
	if err != nil {
		return nil, err
	}
	return &cudaStream{c: c, slot: slot, start: time.Now()}, nil
}

// cudaStream enqueues its first part as a copier batch and adds the later
// ones to it (pitched, batch and per-segment copies: the copy engines take
// more work behind work). After a kernel batch, whose descriptor buffer is
// in use until it completes, later parts are held and copied as a second
// batch in Finish.
type cudaStream struct {
	c     *CUDA
	slot  *copierSlot
	start time.Time
	p     *cuda.Pending
	dir   cuda.Direction
	held  []cuda.Segment // parts added after a kernel batch
	err   error
	done  bool // Finish ran: the copier is back in the pool (or retired)
}

func (s *cudaStream) Add(batch []Desc) error {
	if s.done {
		return fmt.Errorf("cuda stream: add after Finish")
	}
	if s.err != nil {
		return s.err
	}
	dir, segs, err := s.c.lower(s.slot.segs[:0], batch)
	s.slot.segs = segs[:0] // the copier copies them before Start or Add returns
	if err == nil && s.p != nil && dir != s.dir && len(segs) > 0 {
		err = fmt.Errorf("cuda stream: a part moves %s after parts moving %s: %w", dir, s.dir, ErrUnsupported)
	}
	for i := 0; err == nil && i < len(segs); i += s.c.maxSegs {
		part := segs[i:min(i+s.c.maxSegs, len(segs))]
		switch {
		case s.p == nil:
			s.dir = dir
			if s.p, err = s.slot.cp.Start(dir, s.c.host, part); err == nil {
				s.c.started(s.p)
			}
		case s.held != nil:
			s.held = append(s.held, part...)
		default:
			if err = s.p.Add(part); errors.Is(err, cuda.ErrNotSupported) {
				s.held, err = append(make([]cuda.Segment, 0, len(part)), part...), nil
			}
		}
	}
	if err != nil {
		s.err = fmt.Errorf("cuda %s stream: %w", dir, err)
	}
	return s.err
}

func (s *cudaStream) Finish(ctx context.Context) error {
	if s.done {
		return errors.Join(s.err, errors.New("cuda stream: Finish called twice"))
	}
	s.done = true
	ok := true
	defer func() {
		s.c.copyNanos.Add(int64(time.Since(s.start)))
		if ok {
			s.c.copiers <- s.slot
		}
	}()
	if s.p == nil {
		return s.err
	}
	err := s.c.wait(ctx, s.p)
	for i := 0; err == nil && s.err == nil && i < len(s.held); i += s.c.maxSegs {
		var p *cuda.Pending
		if p, err = s.slot.cp.Start(s.dir, s.c.host, s.held[i:min(i+s.c.maxSegs, len(s.held))]); err == nil {
			s.c.started(p)
			err = s.c.wait(ctx, p)
		}
	}
	ok = !errors.Is(err, ErrStuck)
	return errors.Join(s.err, err)
}
