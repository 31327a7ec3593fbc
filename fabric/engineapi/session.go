package engineapi

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"github.com/orbitkv/orbitkv/fabric/store"
	"sync"
	"sync/atomic"
	"time"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/tiers/hbm"
	"github.com/orbitkv/orbitkv/transfer"
)

// Errors the engine API maps to gRPC codes (see errors.go).
var (
	errUnknownSession = errors.New("unknown session")
	ErrInvalid        = errors.New("invalid request")
	errClosing        = errors.New("peer is shutting down")
)

// session is one engine worker's registration: its layout, its mapped KV
// buffers and everything it holds (leases, operations).
type session struct {
	// Engine is what the store's saves and loads use: the layout, the
	// buffers and their geometry, a CUDA session's device transport.
	store.Engine
	id        string
	engineID  string
	mapped    []*hbm.Shared
	gpuBufs   []*hbm.GPUBuffer // CUDA sessions: the imported IPC buffers
	keepalive time.Duration
	recompute float64 // the engine's prefill tokens/s; 0 = unknown (ssdrate.go)

	// hbmRelease undoes GPU.RegisterHBM (CUDA sessions; nil otherwise).
	hbmRelease func()
	// faulted: the session's buffer fault was logged (once per session).
	faulted atomic.Bool

	ctx    context.Context // cancelled when the session closes
	cancel context.CancelFunc
	work   sync.WaitGroup // running operations
	mu     struct {
		sync.Mutex
		lastSeen time.Time
		closed   bool
		leases   map[string]*lease
		ops      map[string]*op
	}
}

func newID(prefix string) string {
	var b [12]byte
	_, _ = rand.Read(b[:])
	return prefix + hex.EncodeToString(b[:])
}

// touch records a sign of life.
func (s *session) touch(t time.Time) {
	s.mu.Lock()
	s.mu.lastSeen = t
	s.mu.Unlock()
}

// expired reports whether the session missed its keepalive at t.
func (s *session) expired(t time.Time) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return t.Sub(s.mu.lastSeen) > s.keepalive
}

// begin registers a running operation; it fails once the session closes.
func (s *session) begin() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return fmt.Errorf("%w: session %s is closed", errUnknownSession, s.id)
	}
	s.work.Add(1)
	return nil
}

// sessions is the peer's registry of live sessions.
type sessions struct {
	mu struct {
		sync.Mutex
		byID map[string]*session
	}
}

func newSessions() *sessions {
	s := &sessions{}
	s.mu.byID = make(map[string]*session)
	return s
}

func (r *sessions) add(s *session) {
	r.mu.Lock()
	r.mu.byID[s.id] = s
	r.mu.Unlock()
}

func (r *sessions) get(id string) (*session, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.mu.byID[id]
	if !ok {
		return nil, fmt.Errorf("%w %q", errUnknownSession, id)
	}
	return s, nil
}

func (r *sessions) remove(id string) (*session, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.mu.byID[id]
	delete(r.mu.byID, id)
	return s, ok
}

func (r *sessions) list() []*session {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*session, 0, len(r.mu.byID))
	for _, s := range r.mu.byID {
		out = append(out, s)
	}
	return out
}

// takeExpiredLeases removes and returns the leases that expired at t.
func (s *session) takeExpiredLeases(t time.Time) []*lease {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []*lease
	for id, l := range s.mu.leases {
		if t.After(l.expires) {
			out = append(out, l)
			delete(s.mu.leases, id)
		}
	}
	return out
}

// takeLease removes a lease by id.
func (s *session) takeLease(id string) (*lease, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	l, ok := s.mu.leases[id]
	delete(s.mu.leases, id)
	return l, ok
}

// addLease records a lease; it fails when the session closed meanwhile.
func (s *session) addLease(l *lease) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.mu.closed {
		return false
	}
	s.mu.leases[l.id] = l
	return true
}

// openSession maps the engine's buffers and registers the session.
func (p *API) openSession(spec sessionSpec) (*session, error) {
	s := &session{id: newID("s-"), engineID: spec.engineID, keepalive: spec.keepalive, recompute: spec.recompute}
	s.Layout, s.FP, s.Geom = spec.layout, spec.layout.Fingerprint(), spec.geom
	s.PageBytes = s.Geom.PageBytes()
	if len(spec.shm) == 0 && len(spec.cuda) == 0 {
		s.PageBytes = spec.pageBytes
	}
	if s.PageBytes > uint64(p.maxPageBytes) {
		return nil, fmt.Errorf("%w: page of %d bytes exceeds the dram slab (%v); raise --dram-slab-bytes", ErrInvalid, s.PageBytes, p.maxPageBytes)
	}
	if len(spec.cuda) > 0 {
		if err := p.importCUDA(s, spec.cuda); err != nil {
			return nil, err
		}
	}
	for _, b := range spec.shm {
		if err := p.checkBufferPath(b.path); err != nil {
			s.unmap()
			return nil, err
		}
		m, err := hbm.MapShared(b.path, b.size)
		if err != nil {
			s.unmap()
			return nil, err
		}
		s.mapped = append(s.mapped, m)
		s.Bufs = append(s.Bufs, transfer.HostRegion(b.path, m.Bytes()))
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	s.mu.lastSeen = p.now()
	s.mu.leases = make(map[string]*lease)
	s.mu.ops = make(map[string]*op)
	p.sessions.add(s)
	p.m.sessions.Inc()
	p.log.Info().Str("session", s.id).Str("engine", s.engineID).Str("model", s.Layout.Model).
		Str("layout", s.FP.String()).Uint64("page_bytes", s.PageBytes).Msg("session opened")
	return s, nil
}

// closeSession cancels a session's operations, waits for them, releases its
// leases and unmaps its buffers.
func (p *API) closeSession(id string) bool {
	s, ok := p.sessions.remove(id)
	if !ok {
		return false
	}
	s.mu.Lock()
	s.mu.closed = true
	leases := s.mu.leases
	s.mu.leases = nil
	s.mu.Unlock()
	s.cancel()
	s.work.Wait()
	for _, l := range leases {
		p.releaseLease(l)
	}
	s.unmap()
	p.m.sessions.Dec()
	p.log.Info().Str("session", s.id).Int("leases_released", len(leases)).Msg("session closed")
	return true
}

func (s *session) unmap() {
	for _, m := range s.mapped {
		_ = m.Close()
	}
	s.mapped = nil
	if s.hbmRelease != nil { // the RDMA registrations go before the memory they pin
		s.hbmRelease()
		s.hbmRelease = nil
	}
	for _, b := range s.gpuBufs {
		_ = b.Close()
	}
	s.gpuBufs = nil
	_ = s.Marks.Close()
	s.Marks = nil
}

// sessionSpec is a validated OpenSession request.
type sessionSpec struct {
	engineID  string
	layout    pagekey.Layout
	geom      transfer.Geometry
	shm       []shmSpec
	cuda      []cudaSpec
	keepalive time.Duration
	pageBytes uint64  // lookup-only sessions: page size from the layout
	recompute float64 // the engine's prefill tokens/s; 0 = unknown (ssdrate.go)
}

type shmSpec struct {
	path string
	size uint64
}
