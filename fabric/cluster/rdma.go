package cluster

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	ibv "github.com/orbitkv/orbitkv/rdma"
	trdma "github.com/orbitkv/orbitkv/transfer/rdma"
)

// The RDMA side of the cluster: the engine opened at Start (none where no
// device is usable: the peer then logs why and uses TCP), one dialed Conn
// per member that advertised a device, the connections accepted from
// members, and the owners of accepted connection IDs.

// Timings of RDMA connection setup.
const (
	rdmaTick       = 250 * time.Millisecond // how often members without a link are dialed
	rdmaDialLimit  = 5 * time.Second        // one exchange and connect
	rdmaRetryAfter = 5 * time.Second        // after a failed exchange
)

type rdmaSide struct {
	cfg ibv.Config
	log zerolog.Logger
	eng *ibv.Engine // nil: no usable device
	// live is eng once opened, for the metrics (scrapes may run during
	// Start).
	live atomic.Pointer[ibv.Engine]
	why  string // why eng is nil ("" once opened)
	tr   *trdma.Transport
	regs trdma.Registry

	placer Placer      // the store's DRAM (place.go); nil without an engine
	dram   *ibv.Region // its registration, offered to members

	transport *prometheus.GaugeVec // orbitkv_cluster_member_transport{member,transport}
	fallbacks prometheus.Counter   // orbitkv_cluster_transport_fallbacks_total
	tcpPages  prometheus.Counter   // orbitkv_cluster_rdma_fallback_pages_total

	mu struct {
		sync.Mutex
		links    map[string]*link       // by member name: this peer's dialed side
		accepted map[string][]*ibv.Conn // by member name: conns members dialed here
		owners   map[uint64]string      // accepted connection ID → the member that sent it
		shown    map[string]string      // member → transport label its gauge carries
	}
}

// link is this peer's dialed RDMA connection to one member.
type link struct {
	conn    *ibv.Conn
	state   linkState
	lastErr string
	nextTry time.Time
}

func newRDMASide(cfg ibv.Config, reg *prometheus.Registry, log zerolog.Logger) *rdmaSide {
	opts := func(name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "orbitkv", Subsystem: "cluster", Name: name, Help: help}
	}
	r := &rdmaSide{cfg: cfg, log: log, why: "rdma not opened",
		transport: prometheus.NewGaugeVec(prometheus.GaugeOpts(opts("member_transport",
			"1 for each member with the data plane this peer uses to reach it (tcp, rdma).")), []string{"member", "transport"}),
		fallbacks: prometheus.NewCounter(prometheus.CounterOpts(opts("transport_fallbacks_total",
			"Members whose RDMA lane went down, so their pages move over TCP."))),
		tcpPages: prometheus.NewCounter(prometheus.CounterOpts(opts("rdma_fallback_pages_total",
			"Pages of RDMA routes carried over TCP: not in the member's DRAM, no placement, a lane down, a READ that failed its checksum."))),
	}
	reg.MustRegister(r.transport, r.fallbacks, r.tcpPages, newRDMACollector(&r.live))
	r.mu.links, r.mu.accepted = map[string]*link{}, map[string][]*ibv.Conn{}
	r.mu.owners, r.mu.shown = map[uint64]string{}, map[string]string{}
	r.tr = &trdma.Transport{Conn: r.connOf, Regions: &r.regs}
	return r
}

// open opens the engine and logs, once, what the data plane will be.
func (r *rdmaSide) open(open func(ibv.Config) (*ibv.Engine, error)) {
	e, err := open(r.cfg)
	switch {
	case err == nil:
		r.eng, r.why = e, ""
		r.live.Store(e)
		r.log.Info().Interface("nics", e.NICs()).Msg("rdma: devices open; members with a device are reached over RDMA")
	case errors.Is(err, ibv.ErrDisabled):
		r.why = "rdma off"
		r.log.Info().Msg("rdma: off (--rdma-devices none); data plane uses TCP")
	case errors.Is(err, ibv.ErrNoDevice):
		r.why = "no local device"
		ev := r.log.Info()
		if len(r.cfg.Devices) > 0 { // asked for by name: worth a warning
			ev = r.log.Warn()
		}
		ev.Str("reason", err.Error()).Msg(noDeviceLine(err))
	default:
		r.why = "rdma open failed"
		r.log.Warn().Err(err).Msg(fmt.Sprintf("rdma: open failed (%v); data plane uses TCP", err))
	}
}

// noDeviceLine is the start's log line without a device: "rdma: no RDMA
// device (why); data plane uses TCP".
func noDeviceLine(err error) string {
	why := strings.TrimPrefix(err.Error(), ibv.ErrNoDevice.Error())
	why = strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(why), ":"))
	if why == "" {
		return "rdma: no RDMA device; data plane uses TCP"
	}
	if i := strings.Index(why, ")"); strings.HasPrefix(why, "(") && i > 0 { // "(hint): rest" → "hint: rest"
		why = why[1:i] + why[i+1:]
	}
	return "rdma: no RDMA device (" + why + "); data plane uses TCP"
}

// registerDRAM registers the DRAM region with the engine for members'
// READs (and this side's READ destinations); without an engine it does
// nothing.
func (r *rdmaSide) registerDRAM(p Placer) error {
	if r.eng == nil || p == nil {
		return nil
	}
	reg := p.DRAMRegion()
	mr, err := r.eng.RegisterHost(reg.Name, reg.Host, ibv.RemoteRead)
	if err != nil {
		return fmt.Errorf("rdma: register the dram pool: %w", err)
	}
	r.regs.Add(reg, mr)
	r.placer, r.dram = p, mr
	return nil
}

// local is "" with a usable device, else why not.
func (r *rdmaSide) local() string { return r.why }

func (r *rdmaSide) connOf(member string) (*ibv.Conn, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	l := r.mu.links[member]
	if l == nil || l.state != linkUp {
		return nil, fmt.Errorf("member %s: %w", member, ibv.ErrLaneDown)
	}
	return l.conn, nil
}

// choice is member's data plane now.
func (r *rdmaSide) choice(member string, memberRDMA bool) choice {
	r.mu.Lock()
	defer r.mu.Unlock()
	var st linkState
	var last string
	if l := r.mu.links[member]; l != nil {
		st, last = l.state, l.lastErr
	}
	return chooseTransport(r.local(), memberRDMA, st, last)
}

// show sets member's transport gauge to ch (and removes its old label).
func (r *rdmaSide) show(member string, ch choice) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if old, ok := r.mu.shown[member]; ok && old != ch.transport {
		r.transport.DeleteLabelValues(member, old)
	}
	r.mu.shown[member] = ch.transport
	r.transport.WithLabelValues(member, ch.transport).Set(1)
}

// laneDown records that member's lane went down after use: TCP until a
// fresh connection is dialed, rdmaRetryAfter from now (run's next dial
// replaces the connection: a link that came back carries RDMA again).
func (r *rdmaSide) laneDown(member string, err error) {
	r.mu.Lock()
	l := r.mu.links[member]
	was := l != nil && l.state == linkUp
	if was {
		l.state, l.lastErr, l.nextTry = linkDown, err.Error(), time.Now().Add(rdmaRetryAfter)
	}
	r.mu.Unlock()
	if was {
		r.fallbacks.Inc()
		r.show(member, choice{transport: transportTCP})
		r.log.Warn().Str("member", member).Err(err).Msg("rdma: lane down; member's pages move over TCP")
	}
}

// forget closes every connection with member (it left).
func (r *rdmaSide) forget(member string) {
	r.mu.Lock()
	l := r.mu.links[member]
	acc := r.mu.accepted[member]
	delete(r.mu.links, member)
	delete(r.mu.accepted, member)
	for id, m := range r.mu.owners {
		if m == member {
			delete(r.mu.owners, id)
		}
	}
	if t, ok := r.mu.shown[member]; ok {
		r.transport.DeleteLabelValues(member, t)
		delete(r.mu.shown, member)
	}
	r.mu.Unlock()
	if l != nil && l.conn != nil {
		l.conn.Close()
	}
	for _, c := range acc {
		c.Close()
	}
}

// close releases the engine (every connection with it).
func (r *rdmaSide) close() {
	if r.eng != nil {
		r.eng.Close()
	}
}

// due lists the members to dial now: they advertised a device, and have no
// link, or a failed or down one whose retry time passed. Pure but for the
// lock.
func (r *rdmaSide) due(members map[string]bool, now time.Time) []string {
	if r.eng == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []string
	for m, hasDevice := range members {
		l := r.mu.links[m]
		if hasDevice && (l == nil || (l.state == linkFailed || l.state == linkDown) && !now.Before(l.nextTry)) {
			out = append(out, m)
		}
	}
	return out
}

// dialed records the outcome of a dial to member. A connection it replaces
// (one whose lane went down) is closed: Close waits for a batch on it.
func (r *rdmaSide) dialed(member string, conn *ibv.Conn, err error, now time.Time) {
	r.mu.Lock()
	l := r.mu.links[member]
	if l == nil {
		l = &link{}
		r.mu.links[member] = l
	}
	old := l.conn
	if err != nil {
		l.conn, l.state, l.lastErr, l.nextTry = nil, linkFailed, err.Error(), now.Add(rdmaRetryAfter)
	} else {
		l.conn, l.state, l.lastErr = conn, linkUp, ""
	}
	r.mu.Unlock()
	if old != nil && old != conn {
		old.Close()
	}
	if err != nil {
		r.log.Warn().Str("member", member).Err(err).Msg("rdma: connection exchange failed; member reached over TCP")
		return
	}
	r.log.Info().Str("member", member).Interface("lanes", conn.Lanes()).Msg("rdma: connected; member reached over RDMA")
}

// owner checks that the member sending a connection ID is the one that
// sent it first, and records it for a new ID. Only that member may
// (re)connect it: another could otherwise take over a connection's lanes.
func (r *rdmaSide) owner(id uint64, member string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if m, ok := r.mu.owners[id]; ok && m != member {
		return fmt.Errorf("rdma connection %#x belongs to member %q, not %q", id, m, member)
	}
	r.mu.owners[id] = member
	return nil
}

// run dials the members that advertised a device until ctx ends: members
// lists the live ones (true: it advertised a device), exchange carries
// connection data to one over the peer service.
func (r *rdmaSide) run(ctx context.Context, members func() map[string]bool, exchange func(context.Context, string, ibv.ConnInfo) (ibv.ConnInfo, error)) {
	t := time.NewTicker(rdmaTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		for _, m := range r.due(members(), time.Now()) {
			r.dial(ctx, m, exchange)
		}
	}
}

// dial connects to member through exchange.
func (r *rdmaSide) dial(ctx context.Context, member string, exchange func(context.Context, string, ibv.ConnInfo) (ibv.ConnInfo, error)) {
	ctx, cancel := context.WithTimeout(ctx, rdmaDialLimit)
	defer cancel()
	conn, err := r.eng.Dial(ctx, func(ctx context.Context, local ibv.ConnInfo) (ibv.ConnInfo, error) {
		return exchange(ctx, member, local)
	})
	r.dialed(member, conn, err, time.Now())
	r.show(member, r.choice(member, true))
}

// accept answers a member's ExchangeRDMA: its connection data in, this
// peer's out (Engine.Accept), the errors as gRPC statuses.
func (r *rdmaSide) accept(member string, wire []byte) ([]byte, error) {
	if r.eng == nil {
		return nil, status.Error(codes.FailedPrecondition, r.local())
	}
	info, err := ibv.UnmarshalConnInfo(wire)
	if err != nil {
		return nil, rdmaStatus(err)
	}
	if err := r.owner(info.ID, member); err != nil {
		return nil, status.Error(codes.PermissionDenied, err.Error())
	}
	reply, conn, err := r.eng.Accept(info)
	if err != nil {
		return nil, rdmaStatus(err)
	}
	// A new connection from member replaces the ones it dialed before (it
	// keeps one link per member, and closes the old one when it redials).
	r.mu.Lock()
	var stale []*ibv.Conn
	if !containsConn(r.mu.accepted[member], conn) {
		stale = r.mu.accepted[member]
		r.mu.accepted[member] = []*ibv.Conn{conn}
	}
	r.mu.Unlock()
	for _, c := range stale {
		c.Close()
	}
	out, err := reply.Marshal()
	if err != nil {
		return nil, rdmaStatus(err)
	}
	return out, nil
}

func containsConn(cs []*ibv.Conn, c *ibv.Conn) bool {
	for _, x := range cs {
		if x == c {
			return true
		}
	}
	return false
}

// rdmaCodes maps the rdma package's errors to gRPC codes where the peer
// service returns them (the engine API's table has the same rows).
var rdmaCodes = []struct {
	err  error
	code codes.Code
}{
	{ibv.ErrBadConnInfo, codes.InvalidArgument},
	{ibv.ErrNoDevice, codes.FailedPrecondition},
	{ibv.ErrNotSupported, codes.FailedPrecondition},
	{ibv.ErrLaneDown, codes.Unavailable},
	{ibv.ErrClosed, codes.Unavailable},
	{ibv.ErrTimeout, codes.DeadlineExceeded},
}

func rdmaStatus(err error) error {
	for _, c := range rdmaCodes {
		if errors.Is(err, c.err) {
			return status.Error(c.code, err.Error())
		}
	}
	return status.Error(codes.Internal, err.Error())
}
