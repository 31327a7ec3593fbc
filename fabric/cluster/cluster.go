package cluster

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/rs/zerolog"
	"google.golang.org/grpc"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pki"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// The cluster: membership by memberlist, the shared catalog by announcement.
//
// Each peer announces its own catalog changes (a page Added: have; Deleted:
// drop) to every live member directly, as small UDP messages numbered by a
// per-peer sequence, within milliseconds of the commit. Receivers keep a
// Remote index of who holds what. A receiver that finds a hole in a
// member's sequence (a lost packet, a member it just met, a restarted
// member: a new incarnation) asks that member for a Snapshot of its
// catalog over the peer gRPC service and applies the announcements after
// the snapshot's sequence on top. Every second each peer sends its last
// sequence number, and memberlist's push/pull
// carries it too, so a lost tail is noticed. A member that leaves or fails
// takes its pages out of the index at once.
//
// Pages move on the data plane (transfer/tcp); remote.go fetches them.

// Timings of the catalog dissemination.
const (
	syncTick       = 100 * time.Millisecond // how often holes are looked for
	gapGrace       = 500 * time.Millisecond // a hole may fill (reordering) before a sync
	behindGrace    = time.Second            // a member's later sequence seen, nothing arrived
	heartbeatEvery = time.Second
	snapshotChunk  = 16384 // entries per SnapshotChunk
	maxEarly       = 1 << 16
	maxPendingOut  = 1 << 20
	syncDeadline   = 2 * time.Minute
	maxSyncs       = 2
)

// Cluster is this peer's membership and view of the shared catalog.
type Cluster struct {
	cfg         Config
	leases      *leaseTable // placements members hold (place.go)
	name        string
	incarnation uint64
	log         zerolog.Logger
	logLimit    logLimit // gossip's warnings and errors (loglimit.go)
	cat         *catalog.Catalog
	remote      *index // members' pages: announced, or summarized (index.go)
	m           *clusterMetrics
	tls         *pki.Configs // nil: plain TCP
	auth        *auth        // nil without mutual TLS: membership is not authenticated (auth.go)
	rd          *rdmaSide    // the RDMA data plane (rdma.go)

	ml         *memberlist.Memberlist
	mlp        atomic.Pointer[memberlist.Memberlist] // ml, for memberlist's callbacks (they may run before Start sets ml)
	data       *tcp.Client
	dataSrv    *tcp.Server
	served     servedStats // orbitkv_cluster_served_*: dataSrv's counters (served.go)
	rejoin     rejoiner    // failed members to join again (rejoin.go)
	peerSrv    *grpc.Server
	peerAddr   string // advertised; guarded by mu
	dataAddr   string // advertised; guarded by mu
	gossipAddr string // guarded by mu

	out struct {
		sync.Mutex
		seq     uint64 // last sequence number given
		sent    uint64 // last sequence number sent
		pending []announcement
		own     *ownSummary // with Config.CompactCatalog: this peer's filter (summary.go); nil before Start
	}
	wake chan struct{}

	mu      sync.Mutex
	origins map[string]*origin
	byID    map[int]*origin             // origins by id: lookups by id cost the same at 1,000 members as at 2 (putOriginLocked)
	ids     []bool                      // origin ids taken, from a member's arrival until the index forgot it (takeIDLocked)
	conns   map[string]*grpc.ClientConn // peer service, by address

	syncs chan struct{} // semaphore of running syncs
	wg    sync.WaitGroup
}

// memberState is where a tracked member stands.
type memberState uint8

const (
	stateAlive memberState = iota // in memberlist's view; its pages may be offered
	stateLeft                     // this peer left the cluster: nothing of it is offered
)

func (s memberState) String() string {
	if s == stateAlive {
		return "alive"
	}
	return "left"
}

// origin is what this peer tracks of one other member.
type origin struct {
	name               string
	id                 int
	incarnation        uint64
	gossipAddr         string
	peerAddr, dataAddr string
	state              memberState
	rdma               bool      // it advertised a usable RDMA device
	compact            bool      // it publishes a compact summary, not every page (summary.go)
	cert               *[32]byte // the fingerprint of the certificate its metadata proves (with mutual TLS)

	applied     uint64                  // every announcement ≤ applied is in the index
	synced      bool                    // the index holds a snapshot plus every announcement since
	current     bool                    // a snapshot of this incarnation was applied (lookups may offer its pages)
	early       map[uint64]announcement // announcements after a hole, by sequence
	gapSince    time.Time
	known       uint64 // the highest sequence heard of
	behindSince time.Time
	syncing     bool
	syncedAt    time.Time
	nextTry     time.Time
	failures    int
}

// Announce is the catalog's OnChange hook: it numbers the change and queues
// it for the sender. It runs under the catalog's writer lock and never
// blocks.
func (c *Cluster) Announce(e catalog.Entry, ch catalog.Change) {
	if c.cfg.CompactCatalog {
		c.announceSummary(e, ch)
		return
	}
	a, ok := announceOf(e, ch)
	if !ok {
		return
	}
	c.out.Lock()
	c.out.seq++
	if len(c.out.pending) >= maxPendingOut {
		// The sender fell far behind: drop the oldest. Receivers see the
		// hole in the sequence and take a snapshot.
		c.out.pending = slices.Delete(c.out.pending, 0, len(c.out.pending)/2)
	}
	c.out.pending = append(c.out.pending, a)
	c.out.Unlock()
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

// currentSeq is the last sequence number given to a change.
func (c *Cluster) currentSeq() uint64 {
	c.out.Lock()
	defer c.out.Unlock()
	return c.out.seq
}

// runSender sends queued announcements to every live member, and a
// heartbeat with the last sequence number once a second.
func (c *Cluster) runSender(ctx context.Context) {
	t := time.NewTicker(heartbeatEvery)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.wake:
			c.sendPending()
		case <-t.C:
			c.sendHeartbeat()
		}
	}
}

func (c *Cluster) sendPending() {
	c.out.Lock()
	anns := c.out.pending
	first := c.out.seq - uint64(len(anns)) + 1
	c.out.pending = nil
	c.out.sent = c.out.seq
	c.out.Unlock()
	if len(anns) == 0 {
		return
	}
	encode := encodeAnnouncements
	if c.cfg.CompactCatalog {
		encode = encodeFlips
	}
	msgs := encode(c.name, c.incarnation, first, anns)
	c.broadcast(msgs)
	c.m.announced.Add(float64(len(anns)))
}

func (c *Cluster) sendHeartbeat() {
	// Every second, changed or not: one lost heartbeat must not hide a
	// lost last announcement until the next push/pull.
	c.out.Lock()
	seq := c.out.sent
	c.out.Unlock()
	c.broadcast([][]byte{encodeState(c.name, c.incarnation, seq)})
}

func (c *Cluster) broadcast(msgs [][]byte) {
	// To the addresses this peer tracks, copied under its lock: the *Node
	// values memberlist's Members returns are updated in place by its own
	// goroutines (a data race to read them here).
	c.mu.Lock()
	var to []memberlist.Address
	for _, o := range c.origins {
		if o.state == stateAlive && o.gossipAddr != "" {
			to = append(to, memberlist.Address{Addr: o.gossipAddr, Name: o.name})
		}
	}
	c.mu.Unlock()
	for _, a := range to {
		for _, msg := range msgs {
			if err := c.ml.SendToAddress(a, msg); err != nil {
				c.m.sendErrors.Inc()
				c.log.Debug().Err(err).Str("to", a.Name).Msg("announcement not sent")
			}
		}
	}
}

// receive handles a member's announcement or state message.
func (c *Cluster) receive(msg []byte) {
	h, body, err := decodeHead(msg)
	if err != nil {
		c.logLimit.event(c.log, zerolog.WarnLevel).Err(err).Msg("gossip message dropped")
		c.m.badMessages.Inc()
		return
	}
	var anns []announcement
	if h.kind == msgAnnounce || h.kind == msgFlips {
		decode := decodeAnnouncements
		if h.kind == msgFlips {
			decode = decodeFlips
		}
		if anns, err = decode(body); err != nil {
			c.logLimit.event(c.log, zerolog.WarnLevel).Err(err).Str("from", h.name).Msg("gossip message dropped")
			c.m.badMessages.Inc()
			return
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.origins[h.name]
	if o == nil || o.incarnation != h.incarnation {
		return // not met yet, or an old or new life of it: membership and a snapshot sort it out
	}
	last := h.seq
	if len(anns) > 0 {
		last = h.seq + uint64(len(anns)) - 1
	}
	o.known = max(o.known, last)
	for i, a := range anns {
		c.m.received.Inc()
		c.admitLocked(o, h.seq+uint64(i), a)
	}
	c.checkBehindLocked(o)
}

// admitLocked applies announcement seq of o, or keeps it until the hole
// before it is filled by a snapshot.
func (c *Cluster) admitLocked(o *origin, seq uint64, a announcement) {
	switch {
	case o.synced && seq <= o.applied:
		return // a duplicate (memberlist may deliver twice)
	case o.synced && seq == o.applied+1:
		c.applyLocked(o, a)
		o.applied = seq
		c.drainEarlyLocked(o)
		return
	}
	if len(o.early) >= maxEarly {
		o.early = nil // too far behind to catch up by announcements: a snapshot will
	}
	if o.early == nil {
		o.early = map[uint64]announcement{}
	}
	o.early[seq] = a
	if o.gapSince.IsZero() {
		o.gapSince = time.Now()
	}
}

func (c *Cluster) applyLocked(o *origin, a announcement) {
	switch a.op {
	case opSet, opClear, opReset:
		c.applyFlipLocked(o, a)
		return
	}
	if a.op == opHave {
		if err := c.remote.Add(o.id, a.key, a.layout, a.size); err != nil {
			c.log.Warn().Err(err).Str("origin", o.name).Msg("announcement not indexed")
		}
		return
	}
	c.remote.Remove(o.id, a.key)
}

// drainEarlyLocked applies kept announcements that now follow on.
func (c *Cluster) drainEarlyLocked(o *origin) {
	for seq := range o.early {
		if seq <= o.applied {
			delete(o.early, seq)
		}
	}
	for {
		a, ok := o.early[o.applied+1]
		if !ok {
			break
		}
		delete(o.early, o.applied+1)
		c.applyLocked(o, a)
		o.applied++
	}
	if len(o.early) == 0 {
		// nil, not empty: a map keeps the memory of its largest size, and a
		// burst of holes may have grown it to maxEarly.
		o.gapSince, o.early = time.Time{}, nil
	}
}

func (c *Cluster) checkBehindLocked(o *origin) {
	switch {
	case o.synced && o.applied >= o.known:
		o.behindSince = time.Time{}
	case o.behindSince.IsZero():
		o.behindSince = time.Now()
	}
}

// needsSyncLocked says whether o's part of the index must be rebuilt from
// a snapshot now.
func needsSyncLocked(o *origin, now time.Time) bool {
	if o.syncing || o.state != stateAlive || now.Before(o.nextTry) {
		return false
	}
	return !o.synced ||
		!o.gapSince.IsZero() && now.Sub(o.gapSince) > gapGrace ||
		!o.behindSince.IsZero() && now.Sub(o.behindSince) > behindGrace
}

// runSyncer starts snapshot syncs of members whose part of the index is
// incomplete.
func (c *Cluster) runSyncer(ctx context.Context) {
	t := time.NewTicker(syncTick)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			c.expireMembers()
			c.mu.Lock()
			var due []*origin
			for _, o := range c.origins {
				if needsSyncLocked(o, now) {
					o.syncing = true
					due = append(due, o)
				}
			}
			c.mu.Unlock()
			for _, o := range due {
				select {
				case c.syncs <- struct{}{}:
				case <-ctx.Done():
					return
				}
				c.wg.Add(1)
				go func() {
					defer c.wg.Done()
					defer func() { <-c.syncs }()
					c.sync(ctx, o)
				}()
			}
		}
	}
}

// sync rebuilds o's part of the index from its snapshot.
func (c *Cluster) sync(ctx context.Context, o *origin) {
	start := time.Now()
	c.mu.Lock()
	o.synced = false // announcements wait in early until the snapshot is in
	inc, addr := o.incarnation, o.peerAddr
	c.mu.Unlock()
	seq, n, err := c.pullSnapshot(ctx, o, inc, addr)
	c.mu.Lock()
	defer c.mu.Unlock()
	o.syncing = false
	if err != nil {
		o.failures++
		o.nextTry = time.Now().Add(min(time.Duration(o.failures)*time.Second, 30*time.Second))
		c.m.syncs.WithLabelValues("failed").Inc()
		c.log.Warn().Err(err).Str("origin", o.name).Int("failures", o.failures).Msg("catalog snapshot failed")
		return
	}
	if o.incarnation != inc || c.origins[o.name] != o {
		return // it restarted or left meanwhile
	}
	o.failures, o.applied, o.synced, o.current, o.syncedAt = 0, seq, true, true, time.Now()
	o.known = max(o.known, seq)
	c.drainEarlyLocked(o)
	c.checkBehindLocked(o)
	c.m.syncs.WithLabelValues("ok").Inc()
	c.log.Info().Str("origin", o.name).Int("pages", n).Uint64("seq", seq).Dur("took", time.Since(start)).Msg("catalog snapshot applied")
}

// pullSnapshot streams o's snapshot into the index, replacing what o had
// there. It returns the sequence number the snapshot includes.
func (c *Cluster) pullSnapshot(ctx context.Context, o *origin, inc uint64, addr string) (uint64, int, error) {
	cc, err := c.peerConn(addr)
	if err != nil {
		return 0, 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, syncDeadline)
	defer cancel()
	stream, err := pb.NewPeerServiceClient(cc).Snapshot(ctx, &pb.SnapshotRequest{From: c.name})
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot from %s: %w", addr, err)
	}
	first, err := stream.Recv()
	if err != nil {
		return 0, 0, fmt.Errorf("snapshot from %s: %w", addr, err)
	}
	if first.Origin != o.name || first.Incarnation != inc {
		return 0, 0, fmt.Errorf("snapshot from %s is of %s/%d, want %s/%d", addr, first.Origin, first.Incarnation, o.name, inc)
	}
	c.mu.Lock()
	compact := o.compact
	c.mu.Unlock()
	var all []announcement
	var words []byte // compact: the member's filter
	for chunk := first; ; {
		if compact {
			words = append(words, chunk.Entries...)
		} else {
			anns, err := decodeSnapshotEntries(chunk.Entries)
			if err != nil {
				return 0, 0, err
			}
			all = append(all, anns...)
		}
		if chunk, err = stream.Recv(); err != nil {
			if errors.Is(err, io.EOF) {
				break
			}
			return 0, 0, fmt.Errorf("snapshot from %s: %w", addr, err)
		}
	}
	// Replace o's part of the index in one step, and only while o is still
	// this life of the member: its id may have gone to another member.
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.origins[o.name] != o || o.incarnation != inc {
		return 0, 0, fmt.Errorf("snapshot from %s: the member left or restarted meanwhile", addr)
	}
	if compact {
		n, err := c.installSummary(o, words)
		return first.Seq, n, err
	}
	c.remote.DropOrigin(o.id)
	for _, a := range all {
		if err := c.remote.Add(o.id, a.key, a.layout, a.size); err != nil {
			return 0, 0, err
		}
	}
	return first.Seq, len(all), nil
}

// memberUp records a member that joined or changed (a restart brings a new
// incarnation: its old pages leave the index and a snapshot is due).
func (c *Cluster) memberUp(n *memberlist.Node) {
	if n.Name == c.name {
		return
	}
	meta, err := decodeMeta(n.Meta)
	if err != nil {
		c.log.Warn().Err(err).Str("member", n.Name).Msg("member without usable metadata ignored")
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.origins[n.Name]
	if o == nil {
		id, err := c.takeIDLocked()
		if err != nil {
			c.log.Error().Err(err).Str("member", n.Name).Msg("member not indexed: its pages are not offered")
			return
		}
		o = &origin{name: n.Name, id: id}
		c.putOriginLocked(o)
		c.log.Info().Str("member", n.Name).Str("data", meta.dataAddr).Msg("member joined")
	}
	if o.incarnation != meta.incarnation {
		// A new life: lookups stop offering its pages at once (usable needs
		// a snapshot of this incarnation); the snapshot replaces them. No
		// scan of the index here: memberlist holds its node lock.
		o.incarnation, o.applied, o.known, o.synced, o.early = meta.incarnation, 0, 0, false, nil
		o.current = false
		o.gapSince, o.behindSince, o.nextTry, o.failures = time.Time{}, time.Time{}, time.Time{}, 0
	}
	o.gossipAddr = net.JoinHostPort(n.Addr.String(), strconv.Itoa(int(n.Port)))
	o.peerAddr, o.dataAddr, o.state, o.rdma, o.compact = meta.peerAddr, meta.dataAddr, stateAlive, meta.rdma, meta.compact
	o.cert = nil
	if meta.proof != nil {
		o.cert = &meta.proof.fpr
	}
	c.m.members.Set(float64(len(c.origins) + 1))
	c.rejoin.memberUp(n.Name)
	c.rd.show(n.Name, c.rd.choice(n.Name, meta.rdma))
}

// memberDown forgets a member that left or failed, with its pages.
func (c *Cluster) memberDown(n *memberlist.Node) { c.forgetMember(n.Name, true) }

// forgetMember takes name out of the members and its pages out of the
// index; rejoin: try to join it again (a member that went down).
func (c *Cluster) forgetMember(name string, rejoin bool) {
	c.mu.Lock()
	o := c.origins[name]
	if o == nil {
		c.mu.Unlock()
		return
	}
	delete(c.origins, name)
	delete(c.byID, o.id)
	c.m.members.Set(float64(len(c.origins) + 1))
	c.mu.Unlock()
	if rejoin {
		c.rejoin.memberDown(name, o.gossipAddr)
	}
	// The index scan runs off memberlist's callback (it holds its node
	// lock); the id is reused only after it.
	go func() {
		dropped := c.remote.DropOrigin(o.id)
		c.mu.Lock()
		c.ids[o.id] = false
		c.mu.Unlock()
		c.data.Forget(o.dataAddr)
		c.rd.forget(name)
		c.log.Warn().Str("member", name).Int("pages_dropped", dropped).Msg("member left or failed; its pages are no longer offered")
	}()
}

// errTooManyMembers reports a member past the catalog's origin ids.
var errTooManyMembers = fmt.Errorf("too many members: the catalog tells %d apart (catalog.MaxOrigins)", catalog.MaxOrigins)

// takeIDLocked takes the lowest free origin id: one a member that left
// gave back (its pages already out of the index), else a new one.
func (c *Cluster) takeIDLocked() (int, error) {
	for i, used := range c.ids {
		if !used {
			c.ids[i] = true
			return i, nil
		}
	}
	if len(c.ids) >= catalog.MaxOrigins {
		return -1, fmt.Errorf("%w: all %d ids are taken", errTooManyMembers, len(c.ids))
	}
	c.ids = append(c.ids, true)
	return len(c.ids) - 1, nil
}

// receiveState handles a member's last sequence number (heartbeat, push/pull).
func (c *Cluster) receiveState(buf []byte) {
	h, _, err := decodeHead(buf)
	if err != nil || h.kind != msgState {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if o := c.origins[h.name]; o != nil && o.incarnation == h.incarnation {
		o.known = max(o.known, h.seq)
		c.checkBehindLocked(o)
	}
}

// Usable says whether origin id is a live member whose pages this peer has
// a snapshot of (its current life).
func (c *Cluster) Usable(id int) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.byID[id]
	return o != nil && o.state == stateAlive && o.current
}

// putOriginLocked adds a member under its name and its id.
func (c *Cluster) putOriginLocked(o *origin) {
	if c.byID == nil {
		c.byID = map[int]*origin{}
	}
	c.origins[o.name] = o
	c.byID[o.id] = o
}

// aliveLocked returns the live member with origin id, or nil.
func (c *Cluster) aliveLocked(id int) *origin {
	if o := c.byID[id]; o != nil && o.state == stateAlive {
		return o
	}
	return nil
}

// DataAddr returns the data address of origin id, if it is alive.
func (c *Cluster) DataAddr(id int) (string, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if o := c.aliveLocked(id); o != nil {
		return o.dataAddr, true
	}
	return "", false
}

// meta is what a member publishes in memberlist's node metadata.
type meta struct {
	incarnation        uint64
	peerAddr, dataAddr string
	rdma               bool // a usable RDMA device (a flags byte after the addresses; older peers send none)
	compact            bool // it publishes a compact summary (the flags byte's metaCompact)
	// proof, after the flags, proves the member holds a certificate of the
	// cluster CA (auth.go); signed is the metadata before it, which it signs.
	proof  *proof
	signed []byte
}

func (m meta) encode() []byte {
	b := []byte{gossipV1}
	b = binary.LittleEndian.AppendUint64(b, m.incarnation)
	for _, s := range []string{m.peerAddr, m.dataAddr} {
		b = append(b, byte(len(s)))
		b = append(b, s...)
	}
	var flags byte
	if m.rdma {
		flags |= metaRDMA
	}
	if m.compact {
		flags |= metaCompact
	}
	return append(b, flags)
}

// Metadata flags: a member with a usable RDMA device; one that publishes a
// compact summary of its pages.
const (
	metaRDMA    = 1
	metaCompact = 2
)

func decodeMeta(b []byte) (meta, error) {
	var m meta
	all := b
	if len(b) < 9 || b[0] != gossipV1 {
		return m, fmt.Errorf("%w: metadata of %d bytes", errGossip, len(b))
	}
	m.incarnation = binary.LittleEndian.Uint64(b[1:])
	b = b[9:]
	var addrs [2]string
	for i := range addrs {
		if len(b) < 1 || len(b) < 1+int(b[0]) {
			return m, fmt.Errorf("%w: metadata truncated", errGossip)
		}
		addrs[i], b = string(b[1:1+int(b[0])]), b[1+int(b[0]):]
		if _, _, err := net.SplitHostPort(addrs[i]); err != nil {
			return m, fmt.Errorf("%w: address %q: %v", errGossip, addrs[i], err)
		}
	}
	m.peerAddr, m.dataAddr = addrs[0], addrs[1]
	m.rdma = len(b) > 0 && b[0]&metaRDMA != 0
	m.compact = len(b) > 0 && b[0]&metaCompact != 0
	if len(b) > 0 {
		b = b[1:]
	}
	m.signed = all[:len(all)-len(b)]
	p, err := decodeProof(b)
	if err != nil {
		return m, err
	}
	m.proof = p
	return m, nil
}

func newIncarnation() uint64 {
	var b [8]byte
	if _, err := rand.Read(b[:]); err != nil {
		return uint64(time.Now().UnixNano())
	}
	return binary.LittleEndian.Uint64(b[:]) | 1
}

// Member is what Peers reports of one member.
type Member struct {
	Name, GossipAddr, PeerAddr, DataAddr string
	State                                string // "alive" or "left"
	Self                                 bool
	Pages                                uint64 // pages it announced (this peer: ownPages)
	Incarnation                          uint64
	SyncedAt                             time.Time // its last snapshot applied here (zero: none)
	// Transport is the data plane this peer reaches it by (tcp, rdma; for
	// this peer: rdma when it has a usable device); TransportWhy says why
	// tcp ("no local device", "member has no device", "rdma lane down", …).
	Transport, TransportWhy string
}

// Peers lists this peer and the members it tracks, sorted by name.
func (c *Cluster) Peers(ownPages uint64) []Member {
	c.mu.Lock()
	self := Member{Name: c.name, PeerAddr: c.peerAddr, DataAddr: c.dataAddr, State: stateAlive.String(), Self: true,
		Pages: ownPages, Incarnation: c.incarnation, GossipAddr: c.gossipAddr}
	out := []Member{self}
	var os []*origin
	for _, o := range c.origins {
		os = append(os, o)
	}
	infos := make([]Member, len(os))
	for i, o := range os {
		infos[i] = Member{Name: o.name, GossipAddr: o.gossipAddr, PeerAddr: o.peerAddr, DataAddr: o.dataAddr,
			State: o.state.String(), Incarnation: o.incarnation, SyncedAt: o.syncedAt}
		ch := c.rd.choice(o.name, o.rdma)
		infos[i].Transport, infos[i].TransportWhy = ch.transport, ch.why
	}
	c.mu.Unlock()
	for i, o := range os {
		infos[i].Pages = uint64(c.remote.Count(o.id))
	}
	out[0].Transport, out[0].TransportWhy = transportRDMA, ""
	if why := c.rd.local(); why != "" {
		out[0].Transport, out[0].TransportWhy = transportTCP, why
	}
	out = append(out, infos...)
	slices.SortFunc(out[1:], func(a, b Member) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// announceSummary is Announce with the compact catalog: the bits a page's
// arrival or departure changed are queued as announcements.
func (c *Cluster) announceSummary(e catalog.Entry, ch catalog.Change) {
	if ch != catalog.Added && ch != catalog.Deleted {
		return
	}
	c.out.Lock()
	own := c.out.own
	if own == nil {
		c.out.Unlock()
		return // before Start: startSummary reads the catalog
	}
	var anns []announcement
	if ch == catalog.Deleted {
		anns = flipAnnouncements(own.remove(e.Key))
	} else if flips, grown := own.add(e.Key); grown {
		anns = []announcement{{op: opReset}}
	} else {
		anns = flipAnnouncements(flips)
	}
	c.queueLocked(anns)
	c.out.Unlock()
	if len(anns) > 0 {
		select {
		case c.wake <- struct{}{}:
		default:
		}
	}
}

// queueLocked numbers anns and queues them for the sender; c.out is held.
func (c *Cluster) queueLocked(anns []announcement) {
	if len(anns) == 0 {
		return
	}
	c.out.seq += uint64(len(anns))
	if len(c.out.pending)+len(anns) > maxPendingOut {
		// The sender fell far behind: drop the oldest (members see the hole
		// and take a snapshot).
		c.out.pending = slices.Delete(c.out.pending, 0, len(c.out.pending)/2)
	}
	c.out.pending = append(c.out.pending, anns...)
}

// applyFlipLocked applies one change of o's filter; a bit set drops o's
// refuted claims (index.Gained).
func (c *Cluster) applyFlipLocked(o *origin, a announcement) {
	if a.op == opReset || !o.compact {
		o.synced = false // a snapshot brings the rebuilt filter (or sorts out a confused member)
		return
	}
	if err := c.remote.sums.Apply(o.id, []catalog.Flip{{Bit: a.bit, Set: a.op == opSet}}); err != nil {
		c.logLimit.event(c.log, zerolog.WarnLevel).Err(err).Str("origin", o.name).Msg("summary change does not fit; taking a snapshot")
		o.synced = false
		return
	}
	if a.op == opSet {
		c.remote.Gained(o.id) // a page it was asked for and lacked may have arrived
	}
}

// installSummary replaces o's part of the index by the filter of a
// snapshot; it returns how many pages the filter holds (an estimate).
// c.mu is held.
func (c *Cluster) installSummary(o *origin, b []byte) (int, error) {
	f, err := decodeFilter(b)
	if err != nil {
		return 0, err
	}
	c.remote.DropOrigin(o.id)
	if err := c.remote.sums.Replace(o.id, f); err != nil {
		return 0, fmt.Errorf("summary of %s: %w", o.name, err)
	}
	return f.Pages(), nil
}
