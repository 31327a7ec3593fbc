package rdma

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
)

// Exchange sends this side's connection data to the peer and returns the
// peer's (the peer calls Engine.Accept with it). The peer gRPC service
// (mutual TLS) carries it as ConnInfo.Marshal bytes; tests pass a function
// that calls the other engine directly.
type Exchange func(ctx context.Context, local ConnInfo) (ConnInfo, error)

// Conn is a reliable connection to one peer engine: one lane (an RC QP with
// its own CQ) per local NIC × Config.QPsPerNIC, over which batches of Ops
// are striped. A Conn runs one batch at a time; open several Conns to one
// peer for parallel batches.
type Conn struct {
	e        *Engine
	id       uint64
	exchange Exchange // nil on the accepting side: the dialer drives recovery

	mu     sync.Mutex // held for a whole batch, a reconnect or Close
	lanes  []*lane
	remote map[uint32]RemoteRegion
	closed bool
	gen    uint64 // batches run, for work request IDs
}

type laneState uint8

const (
	laneUp     laneState = iota // QP in RTS
	laneBroken                  // QP in ERR or reset: reconnect before use
	laneDown                    // reconnect budget spent: not used again
)

// lane is one QP and its CQ on one NIC.
type lane struct {
	idx, nicIdx int
	nic         *nic
	cq, qp      handle
	qpn, psn    uint32
	state       laneState
	peer        LaneInfo
	inflight    int // posted work requests not yet completed
	failures    int // reconnects since the last successful completion
}

// LaneStatus reports a lane for `orbitkv peers` and metrics.
type LaneStatus struct {
	NIC, PeerNIC string
	QPN, PeerQPN uint32
	MTU          int // negotiated, bytes
	Up           bool
	Failures     int
}

// Dial creates the lanes, exchanges connection data through exchange and
// brings every QP to RTS.
func (e *Engine) Dial(ctx context.Context, exchange Exchange) (*Conn, error) {
	if err := e.live(); err != nil {
		return nil, err
	}
	lanes := make([]int, 0, len(e.nics)*e.cfg.QPsPerNIC)
	for i := range e.nics {
		for range e.cfg.QPsPerNIC {
			lanes = append(lanes, i)
		}
	}
	c, err := e.newConn(rand.Uint64(), lanes)
	if err != nil {
		return nil, err
	}
	c.exchange = exchange
	peer, err := exchange(ctx, c.info())
	if err == nil {
		err = c.connect(peer)
	}
	if err != nil {
		c.close()
		return nil, fmt.Errorf("rdma: dial: %w", err)
	}
	if err := e.track(c); err != nil {
		return nil, err
	}
	return c, nil
}

// Accept answers a dialer's connection data: for a new ID it creates one
// lane per dialer lane (spread over this engine's NICs) and connects it;
// for a known ID it reconnects the lanes whose QP number or PSN changed
// (the dialer recovered them) and those broken on this side. It returns
// the data to send back and the accepted Conn, which the caller closes
// when the member leaves. IDs are the dialer's random 64-bit numbers; the
// peer service should accept them only from the member that first sent
// them (it knows the member from its mutual-TLS certificate).
func (e *Engine) Accept(peer ConnInfo) (ConnInfo, *Conn, error) {
	if err := peer.validate(); err != nil {
		return ConnInfo{}, nil, err
	}
	if err := e.live(); err != nil {
		return ConnInfo{}, nil, err
	}
	e.mu.Lock()
	c, known := e.mu.conns[peer.ID]
	e.mu.Unlock()
	if known {
		info, err := c.reaccept(peer)
		return info, c, err
	}
	c, err := e.newConn(peer.ID, acceptNICs(peer.Lanes, len(e.nics)))
	if err == nil {
		err = c.connect(peer)
	}
	if err != nil {
		if c != nil {
			c.close()
		}
		return ConnInfo{}, nil, fmt.Errorf("rdma: accept: %w", err)
	}
	if err := e.track(c); err != nil {
		return ConnInfo{}, nil, err
	}
	return c.info(), c, nil
}

// acceptNICs picks this side's NIC for each of a dialer's lanes: the k-th
// distinct NIC the dialer names (in lane order) pairs with this side's NIC
// k (mod n), so that with as many NICs on each end every lane joins NIC k
// to NIC k whatever the QPs per NIC: hosts cable (or subnet) NIC k to NIC k,
// and lane i to NIC i mod n would pair NIC 0 with NIC 1 at two QPs per NIC.
func acceptNICs(lanes []LaneInfo, n int) []int {
	order := map[string]int{}
	out := make([]int, len(lanes))
	for i, l := range lanes {
		k, ok := order[l.NIC]
		if !ok {
			k = len(order)
			order[l.NIC] = k
		}
		out[i] = k % n
	}
	return out
}

func (e *Engine) track(c *Conn) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.mu.closed {
		c.close()
		return ErrClosed
	}
	e.mu.conns[c.id] = c
	return nil
}

// newConn creates a CQ and a QP in RESET for each lane.
func (e *Engine) newConn(id uint64, nicOfLane []int) (*Conn, error) {
	c := &Conn{e: e, id: id}
	for i, ni := range nicOfLane {
		l := &lane{idx: i, nicIdx: ni, nic: e.nics[ni], state: laneBroken}
		c.lanes = append(c.lanes, l)
		if err := c.createQP(l); err != nil {
			c.close()
			return nil, err
		}
	}
	return c, nil
}

func (c *Conn) createQP(l *lane) error {
	v, cfg := c.e.v, c.e.cfg
	if l.cq == 0 {
		cq, err := v.createCQ(l.nic.ctx, cfg.SendDepth)
		if err != nil {
			return fmt.Errorf("create CQ on %s: %w", l.nic.info.Name, err)
		}
		l.cq = cq
	}
	qp, qpn, err := v.createQP(l.nic.pd, l.cq, qpCaps{SendWR: uint32(cfg.SendDepth), SGE: uint32(cfg.MaxSGE)})
	if err != nil {
		return fmt.Errorf("create QP on %s: %w", l.nic.info.Name, err)
	}
	l.qp, l.qpn, l.psn = qp, qpn, rand.Uint32()&qpnMask
	return nil
}

// info is this side's ConnInfo: its lanes and every region it offers.
func (c *Conn) info() ConnInfo {
	ci := ConnInfo{ID: c.id}
	for _, l := range c.lanes {
		ci.Lanes = append(ci.Lanes, LaneInfo{NIC: l.nic.info.Name, GID: l.nic.info.GID, LID: l.nic.info.LID, QPN: l.qpn, PSN: l.psn, MTU: l.nic.end.MTU})
	}
	c.e.mu.Lock()
	for _, r := range c.e.regionsLocked() {
		if r.Access != LocalOnly {
			ci.Regions = append(ci.Regions, r.remote(c.lanes))
		}
	}
	c.e.mu.Unlock()
	return ci
}

// connect takes every lane to RTS against the peer's lanes.
func (c *Conn) connect(peer ConnInfo) error {
	if err := peer.validate(); err != nil {
		return err
	}
	if len(peer.Lanes) != len(c.lanes) {
		return fmt.Errorf("%w: peer has %d lanes, this side %d", ErrBadConnInfo, len(peer.Lanes), len(c.lanes))
	}
	c.setRemote(peer)
	for i, l := range c.lanes {
		if err := c.connectLane(l, peer.Lanes[i]); err != nil {
			return err
		}
	}
	return nil
}

func (c *Conn) setRemote(peer ConnInfo) {
	c.remote = make(map[uint32]RemoteRegion, len(peer.Regions))
	for _, r := range peer.Regions {
		c.remote[r.Key] = r
	}
}

func (c *Conn) connectLane(l *lane, peer LaneInfo) error {
	end := l.nic.end
	end.PSN = l.psn
	if err := connectQP(c.e.v, l.qp, l.nic.info.Name, end, peer); err != nil {
		l.state = laneBroken
		return err
	}
	l.peer, l.state = peer, laneUp
	return nil
}

// reaccept reconnects the lanes the dialer recovered.
func (c *Conn) reaccept(peer ConnInfo) (ConnInfo, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ConnInfo{}, ErrClosed
	}
	if len(peer.Lanes) != len(c.lanes) {
		return ConnInfo{}, fmt.Errorf("%w: reconnect with %d lanes, connection has %d", ErrBadConnInfo, len(peer.Lanes), len(c.lanes))
	}
	c.setRemote(peer)
	var errs []error
	for i, l := range c.lanes {
		p := peer.Lanes[i]
		if p.QPN == l.peer.QPN && p.PSN == l.peer.PSN && l.state == laneUp {
			continue
		}
		if err := c.resetLane(l, true); err != nil {
			errs = append(errs, err)
			continue
		}
		errs = append(errs, c.connectLane(l, p))
	}
	return c.info(), errors.Join(errs...)
}

// resetLane brings a drained lane's QP back to RESET, with a new PSN if
// fresh (a new QP if the old one was destroyed because it would not drain).
// A lane reset only because the peer restarted its end keeps its PSN: the
// peer already holds it.
func (c *Conn) resetLane(l *lane, fresh bool) error {
	if l.inflight != 0 {
		return fmt.Errorf("rdma: reset lane %d on %s with %d requests in flight", l.idx, l.nic.info.Name, l.inflight)
	}
	if l.qp == 0 {
		return c.createQP(l)
	}
	if err := c.e.v.modifyQP(l.qp, qpAttr{State: QPReset}); err != nil {
		return fmt.Errorf("reset QP %#x on %s: %w", l.qpn, l.nic.info.Name, err)
	}
	if fresh {
		l.psn = rand.Uint32() & qpnMask
	}
	return nil
}

// recoverLocked reconnects broken lanes through the exchange (dialer side
// only), each at most Config.MaxReconnects times in a row: a lane that keeps
// failing right after reconnecting is left down instead of storming the
// peer with handshakes (Mooncake issue 3299).
func (c *Conn) recoverLocked(ctx context.Context) error {
	if c.exchange == nil {
		return nil
	}
	n := c.resetBrokenLocked()
	if n == 0 {
		return nil
	}
	peer, err := c.exchange(ctx, c.info())
	if err == nil && len(peer.Lanes) != len(c.lanes) {
		err = fmt.Errorf("%w: peer answered with %d lanes, this side %d", ErrBadConnInfo, len(peer.Lanes), len(c.lanes))
	}
	if err != nil {
		return fmt.Errorf("rdma: reconnect %d lane(s): %w", n, err)
	}
	c.setRemote(peer)
	return c.reconnectLocked(peer)
}

// resetBrokenLocked resets every broken lane that has reconnects left (a
// new PSN each) and leaves the others down; it returns how many it reset.
func (c *Conn) resetBrokenLocked() int {
	n := 0
	for _, l := range c.lanes {
		if l.state != laneBroken {
			continue
		}
		if l.failures >= max(0, c.e.cfg.MaxReconnects) {
			l.state = laneDown
			continue
		}
		l.failures++
		if err := c.resetLane(l, true); err != nil {
			l.state = laneDown
			continue
		}
		n++
	}
	return n
}

// reconnectLocked connects the lanes reset here to the peer's answer, and
// restarts the lanes that were up here but that the peer reset (they had
// broken there), keeping the PSN the peer was just sent.
func (c *Conn) reconnectLocked(peer ConnInfo) error {
	var errs []error
	for _, l := range c.lanes {
		p := peer.Lanes[l.idx]
		switch {
		case l.state == laneBroken: // reset by resetBrokenLocked
		case l.state == laneUp && (p.QPN != l.peer.QPN || p.PSN != l.peer.PSN):
			if err := c.resetLane(l, false); err != nil {
				l.state = laneBroken
				errs = append(errs, err)
				continue
			}
		default:
			continue
		}
		if err := c.connectLane(l, p); err != nil {
			errs = append(errs, err)
			continue
		}
		c.e.stats.reconnects.Add(1)
	}
	return errors.Join(errs...)
}

// Lanes reports every lane's state.
func (c *Conn) Lanes() []LaneStatus {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]LaneStatus, len(c.lanes))
	for i, l := range c.lanes {
		out[i] = LaneStatus{NIC: l.nic.info.Name, PeerNIC: l.peer.NIC, QPN: l.qpn, PeerQPN: l.peer.QPN,
			MTU: negotiatedMTU(l.nic.end.MTU, l.peer.MTU).Bytes(), Up: l.state == laneUp, Failures: l.failures}
	}
	return out
}

// Close destroys the lanes' QPs and CQs. It waits for a batch in flight.
// Idempotent.
func (c *Conn) Close() error {
	c.e.mu.Lock()
	if c.e.mu.conns[c.id] == c {
		delete(c.e.mu.conns, c.id)
	}
	c.e.mu.Unlock()
	return c.close()
}

func (c *Conn) close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	var errs []error
	for _, l := range c.lanes {
		if l.qp != 0 {
			errs = append(errs, c.e.v.destroyQP(l.qp))
		}
		if l.cq != 0 {
			errs = append(errs, c.e.v.destroyCQ(l.cq))
		}
		l.qp, l.cq, l.state = 0, 0, laneDown
	}
	return errors.Join(errs...)
}
