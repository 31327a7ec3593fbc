package engineapi

import (
	"context"
	"fmt"
	"sync"
	"time"

	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/fabric/store"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// maxWait bounds one Wait call, so no RPC blocks without a deadline.
const maxWait = 60 * time.Second

// maxAskMultiple caps what a request may ask for: a lease at most this many
// times --lease-ttl, an operation's deadline this many times --op-deadline.
const maxAskMultiple = 10

// engineServer implements pb.EngineServiceServer.
type engineServer struct {
	pb.UnimplementedEngineServiceServer
	p *API
}

func (s *engineServer) session(id string) (*session, error) {
	sess, err := s.p.sessions.get(id)
	if err != nil {
		return nil, err
	}
	sess.touch(s.p.now())
	return sess, nil
}

func (s *engineServer) OpenSession(ctx context.Context, r *pb.OpenSessionRequest) (*pb.OpenSessionResponse, error) {
	spec, err := sessionFromPB(r, s.p.cfg.Keepalive)
	if err != nil {
		return nil, toStatus(err)
	}
	sess, err := s.p.openSession(spec)
	if err != nil {
		return nil, toStatus(err)
	}
	if ctx.Err() != nil {
		// The engine stopped waiting (its deadline passed) before the buffers were
		// registered: it never learns this session's id and opens another, so this
		// one goes now instead of holding its mappings until its keepalive lapses.
		s.p.closeSession(sess.id)
		return nil, status.FromContextError(ctx.Err()).Err()
	}
	out := &pb.OpenSessionResponse{SessionId: sess.id, LayoutFingerprint: sess.FP[:], PageBytes: sess.PageBytes,
		KeepaliveMs: uint32(sess.keepalive / time.Millisecond)}
	if sess.Marks != nil {
		out.LayerEvents = sess.Marks.Handles
	}
	return out, nil
}

func (s *engineServer) Keepalive(_ context.Context, r *pb.KeepaliveRequest) (*pb.KeepaliveResponse, error) {
	if _, err := s.session(r.SessionId); err != nil {
		return nil, toStatus(err)
	}
	return &pb.KeepaliveResponse{}, nil
}

func (s *engineServer) CloseSession(_ context.Context, r *pb.CloseSessionRequest) (*pb.CloseSessionResponse, error) {
	if !s.p.closeSession(r.SessionId) {
		return nil, toStatus(errUnknownSession)
	}
	return &pb.CloseSessionResponse{}, nil
}

func (s *engineServer) Lookup(_ context.Context, r *pb.LookupRequest) (*pb.LookupResponse, error) {
	sess, err := s.session(r.SessionId)
	if err != nil {
		return nil, toStatus(err)
	}
	keys, err := keysFromPB(r.Keys, s.p.cfg.MaxKeys)
	if err != nil {
		return nil, toStatus(err)
	}
	rate := sess.recompute // the engine's prefill tokens/s: as measured now, else as declared
	if r.RecomputeTokensPerS > 0 {
		rate = float64(r.RecomputeTokensPerS)
	}
	if int(r.LeaseFrom) > len(keys) {
		return nil, toStatus(fmt.Errorf("%w: lease_from %d is past the %d keys", ErrInvalid, r.LeaseFrom, len(keys)))
	}
	ttl := min(durationMs(r.LeaseMs, s.p.cfg.LeaseTTL), maxAskMultiple*s.p.cfg.LeaseTTL)
	res := s.p.lookup(sess, keys, lookupAsk{take: r.Lease, ttl: ttl, recompute: rate, held: int(r.LeaseFrom)})
	out := &pb.LookupResponse{HitPages: uint32(res.hit), Tiers: &pb.TierCounts{Dram: uint32(res.dram), Ssd: uint32(res.ssd), Remote: uint32(res.remote)},
		RecomputePages: uint32(res.recompute), BudgetCutPages: uint32(res.budgetHits)}
	if res.lease != nil {
		if !sess.addLease(res.lease) {
			s.p.releaseLease(res.lease)
			return nil, toStatus(errUnknownSession)
		}
		out.LeaseId, out.LeaseExpiresUnixMs = res.lease.id, res.lease.expires.UnixMilli()
	}
	return out, nil
}

func (s *engineServer) Save(ctx context.Context, r *pb.SaveRequest) (*pb.OpHandle, error) {
	toSSD, err := durabilityFromPB(r.Durability)
	if err != nil {
		return nil, toStatus(err)
	}
	return s.pageOp(ctx, r.SessionId, r.Pages, r.DeadlineMs, false, r.Wait, nil, func(ctx context.Context, sess *session, pages []store.PageReq, res []store.Result) {
		s.p.pages.Save(ctx, &sess.Engine, pages, toSSD, res)
	})
}

func (s *engineServer) Load(ctx context.Context, r *pb.LoadRequest) (*pb.OpHandle, error) {
	if r.Layerwise {
		if r.Wait {
			return nil, toStatus(fmt.Errorf("%w: a layer-wise load answers once enqueued; it cannot also wait", ErrInvalid))
		}
		return s.layerwiseLoad(ctx, r)
	}
	return s.pageOp(ctx, r.SessionId, r.Pages, r.DeadlineMs, true, r.Wait, s.leaseCheck(r.LeaseId), func(ctx context.Context, sess *session, pages []store.PageReq, res []store.Result) {
		s.p.pages.Load(ctx, &sess.Engine, pages, res)
		if r.EndLease {
			s.p.endLease(r.LeaseId)
		}
	})
}

// leaseCheck checks a Load's lease, when it names one (lease.go).
func (s *engineServer) leaseCheck(id string) func(*session) error {
	return func(sess *session) error { return s.p.checkLoadLease(sess, id, s.p.now()) }
}

// layerwiseLoad starts a layer-wise load and answers once its device copies
// and layer events are enqueued (or the load ended without them).
func (s *engineServer) layerwiseLoad(ctx context.Context, r *pb.LoadRequest) (*pb.OpHandle, error) {
	enq := make(chan struct{})
	var once sync.Once
	o, err := s.startPageOp(r.SessionId, r.Pages, r.DeadlineMs, true, nil, func(sess *session) error {
		if err := s.leaseCheck(r.LeaseId)(sess); err != nil {
			return err
		}
		if sess.Marks == nil {
			return fmt.Errorf("%w: session %s has no layer events (not a CUDA session, or the peer lacks interprocess events): load without layerwise", errLayoutMismatch, sess.id)
		}
		return nil
	}, func(ctx context.Context, sess *session, pages []store.PageReq, res []store.Result) {
		s.p.pages.LoadLayerwise(ctx, &sess.Engine, pages, res, func() { once.Do(func() { close(enq) }) })
		if r.EndLease {
			s.p.endLease(r.LeaseId)
		}
	})
	if err != nil {
		return nil, toStatus(err)
	}
	select {
	case <-enq:
	case <-o.done:
	case <-ctx.Done():
		return nil, toStatus(fmt.Errorf("layer-wise load %s not enqueued: %w", o.id, ctx.Err()))
	}
	return &pb.OpHandle{OpId: o.id}, nil
}

// pageOp validates a Save or Load (check, when given, too) and starts it as
// an operation; with wait it runs the operation on this call's goroutine (no
// hand-off to wake up from) and answers with its status.
func (s *engineServer) pageOp(ctx context.Context, id string, refs []*pb.PageRef, deadlineMs uint32, load, wait bool, check func(*session) error,
	run func(ctx context.Context, sess *session, pages []store.PageReq, res []store.Result)) (*pb.OpHandle, error) {
	var caller context.Context
	if wait {
		caller = ctx
	}
	o, err := s.startPageOp(id, refs, deadlineMs, load, caller, check, run)
	if err != nil {
		return nil, toStatus(err)
	}
	h := &pb.OpHandle{OpId: o.id}
	if wait {
		s.p.forgetOp(o.sess, o.id)
		h.Status = statusToPB(o, true)
	}
	return h, nil
}

// startPageOp validates the session (check, when given, too) and the pages,
// and starts run as an operation (with a caller context: runs it to the end
// on this goroutine, see startOp). Only a load may skip blocks.
func (s *engineServer) startPageOp(id string, refs []*pb.PageRef, deadlineMs uint32, load bool, caller context.Context, check func(*session) error,
	run func(ctx context.Context, sess *session, pages []store.PageReq, res []store.Result)) (*op, error) {
	sess, err := s.session(id)
	if err != nil {
		return nil, err
	}
	if err := s.p.checkBuffers(sess); err != nil {
		return nil, err
	}
	if check != nil {
		if err := check(sess); err != nil {
			return nil, err
		}
	}
	pages, err := pagesFromPB(refs, sess, s.p.cfg.MaxPages, load)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	return s.p.startOp(sess, len(pages), min(durationMs(deadlineMs, s.p.cfg.OpDeadline), maxAskMultiple*s.p.cfg.OpDeadline), caller, func(ctx context.Context, res []store.Result) {
		run(ctx, sess, pages, res)
		s.p.m.ops.done(ctx, load, start, res) // observe.go
	})
}

func (s *engineServer) Wait(ctx context.Context, r *pb.WaitRequest) (*pb.OpStatus, error) {
	sess, err := s.session(r.SessionId)
	if err != nil {
		return nil, toStatus(err)
	}
	timeout := min(time.Duration(r.TimeoutMs)*time.Millisecond, maxWait)
	o, done, err := s.p.waitOp(ctx, sess, r.OpId, timeout)
	if err != nil {
		return nil, toStatus(err)
	}
	return statusToPB(o, done), nil
}

func (s *engineServer) Release(_ context.Context, r *pb.ReleaseRequest) (*pb.ReleaseResponse, error) {
	sess, err := s.session(r.SessionId)
	if err != nil {
		return nil, toStatus(err)
	}
	l, ok := sess.takeLease(r.LeaseId)
	if !ok {
		return nil, toStatus(invalidLease(r.LeaseId))
	}
	s.p.releaseLease(l)
	return &pb.ReleaseResponse{}, nil
}

func invalidLease(id string) error {
	return wrapNotFound("unknown or expired lease %q", id)
}
