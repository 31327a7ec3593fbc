package cluster

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
	trdma "github.com/orbitkv/orbitkv/transfer/rdma"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// Page placements for RDMA READs. A peer with a device registers its DRAM
// pool with the engine (RemoteRead: the region rides every ConnInfo it
// sends). A member that reaches it over RDMA asks PlacePages where a batch
// of pages is; this peer pins the ones in DRAM for a lease (bounded: the
// member's ReleasePlacements or the lease's end), answers their region,
// offset and header, and the member READs them straight into its own fresh
// DRAM slots, then releases the lease. Pages not in DRAM, and every page
// when placement fails, go over the TCP data plane (fallback in
// transport.go), which promotes SSD pages.

// Bounds of placement leases.
const (
	placeLeaseDefault  = 5 * time.Second  // lease_ms 0
	placeLeaseMax      = 30 * time.Second // the longest lease granted
	placeMaxKeys       = 4096             // pages per PlacePages
	placeMaxLeases     = 64               // leases one member may hold at once
	placeCallWithin    = 2 * time.Second  // a PlacePages call (within the batch's own deadline)
	placeReleaseWithin = 2 * time.Second  // a ReleasePlacements call
)

// Placer is what the store gives this peer's placements: its DRAM region
// and the pages in it (fabric/store's *Store implements it; the data plane
// Source passed to Start is checked for it).
type Placer interface {
	DRAMRegion() *transfer.Region
	PlaceDRAM(wants []tcp.Want) ([]transfer.Placed, func())
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

// RDMAStats are the RDMA engine's counters; false without an engine.
func (c *Cluster) RDMAStats() (ibv.Stats, bool) {
	if c.rd.eng == nil {
		return ibv.Stats{}, false
	}
	return c.rd.eng.Stats(), true
}

// leaseTable holds the placements members hold. after is time.AfterFunc
// (injected: tests end leases when they choose).
type leaseTable struct {
	after func(time.Duration, func()) (stop func() bool)
	ended *prometheus.CounterVec // orbitkv_cluster_placement_leases_total{end}

	mu        sync.Mutex
	next      uint64
	held      map[uint64]*placeLease
	perMember map[string]int
}

type placeLease struct {
	member  string
	release func()
	stop    func() bool
}

func newLeaseTable(reg *prometheus.Registry) *leaseTable {
	t := &leaseTable{
		after: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop },
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "cluster", Name: "placement_leases_total",
			Help: "Page placement leases members held for RDMA reads, by how they ended (released, expired, closed)."}, []string{"end"}),
		held: map[uint64]*placeLease{}, perMember: map[string]int{},
	}
	for _, e := range []string{"released", "expired", "closed"} {
		t.ended.WithLabelValues(e)
	}
	reg.MustRegister(t.ended)
	return t
}

// errTooManyLeases reports a member at placeMaxLeases.
var errTooManyLeases = errors.New("too many placement leases held")

// grant records a lease of member's that runs release when it ends, at
// the latest after ttl.
func (t *leaseTable) grant(member string, ttl time.Duration, release func()) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.perMember[member] >= placeMaxLeases {
		return 0, fmt.Errorf("member %s: %w (%d)", member, errTooManyLeases, placeMaxLeases)
	}
	t.next++
	id := t.next
	l := &placeLease{member: member, release: release}
	t.held[id], t.perMember[member] = l, t.perMember[member]+1
	l.stop = t.after(ttl, func() { t.end(id, "", "expired") })
	return id, nil
}

// end ends lease id (member "" for any member's) and runs its release;
// false when it had ended or belongs to another member.
func (t *leaseTable) end(id uint64, member, how string) bool {
	t.mu.Lock()
	l := t.held[id]
	if l == nil || member != "" && l.member != member {
		t.mu.Unlock()
		return false
	}
	delete(t.held, id)
	if t.perMember[l.member]--; t.perMember[l.member] == 0 {
		delete(t.perMember, l.member)
	}
	t.mu.Unlock()
	if how != "expired" {
		l.stop()
	}
	l.release()
	t.ended.WithLabelValues(how).Inc()
	return true
}

// closeAll ends every lease (the cluster stops).
func (t *leaseTable) closeAll() {
	t.mu.Lock()
	ids := make([]uint64, 0, len(t.held))
	for id := range t.held {
		ids = append(ids, id)
	}
	t.mu.Unlock()
	for _, id := range ids {
		t.end(id, "", "closed")
	}
}

// held is how many leases are held (for tests).
func (t *leaseTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.held)
}

// leaseTTL is the lease a request asks for, bounded.
func leaseTTL(ms uint32) time.Duration {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d == 0:
		return placeLeaseDefault
	case d > placeLeaseMax:
		return placeLeaseMax
	}
	return d
}

// PlacePages answers where the asked pages are in this peer's DRAM and
// pins them for a lease (place.go's comment).
func (s *peerServer) PlacePages(ctx context.Context, req *pb.PlaceRequest) (*pb.PlaceReply, error) {
	rd := s.c.rd
	if rd.dram == nil {
		return nil, status.Error(codes.FailedPrecondition, "no dram region registered for rdma: "+rd.local())
	}
	wants, err := placeWants(req)
	if err != nil {
		return nil, status.Error(codes.InvalidArgument, err.Error())
	}
	placed, release := rd.placer.PlaceDRAM(wants)
	reply := &pb.PlaceReply{Pages: make([]*pb.PagePlacement, len(placed))}
	n := 0
	for i, p := range placed {
		reply.Pages[i] = &pb.PagePlacement{}
		if p.OK {
			n++
			reply.Pages[i] = &pb.PagePlacement{InDram: true, Region: rd.dram.Key, Offset: p.Off, Length: p.Header.Length,
				Checksum: p.Header.Checksum, Generation: p.Header.Generation}
		}
	}
	if n == 0 {
		release()
		return reply, nil
	}
	ttl := leaseTTL(req.LeaseMs)
	if reply.Lease, err = s.c.leases.grant(senderOf(ctx, req.From), ttl, release); err != nil {
		release()
		return nil, status.Error(codes.ResourceExhausted, err.Error())
	}
	reply.LeaseMs = uint32(ttl / time.Millisecond)
	return reply, nil
}

// placeWants decodes a PlaceRequest's pages.
func placeWants(req *pb.PlaceRequest) ([]tcp.Want, error) {
	var layout pagekey.Fingerprint
	if len(req.Layout) != len(layout) {
		return nil, fmt.Errorf("layout: %d bytes, want %d", len(req.Layout), len(layout))
	}
	copy(layout[:], req.Layout)
	if len(req.Keys)%pagekey.Size != 0 || len(req.Keys)/pagekey.Size > placeMaxKeys {
		return nil, fmt.Errorf("keys: %d bytes, want a multiple of %d, at most %d keys", len(req.Keys), pagekey.Size, placeMaxKeys)
	}
	wants := make([]tcp.Want, len(req.Keys)/pagekey.Size)
	for i := range wants {
		copy(wants[i].Key[:], req.Keys[i*pagekey.Size:])
		wants[i].Layout, wants[i].Size = layout, req.Size
	}
	return wants, nil
}

// ReleasePlacements ends the caller's lease.
func (s *peerServer) ReleasePlacements(ctx context.Context, req *pb.ReleasePlacementsRequest) (*pb.ReleasePlacementsReply, error) {
	return &pb.ReleasePlacementsReply{Released: s.c.leases.end(req.Lease, senderOf(ctx, req.From), "released")}, nil
}

// placing is the RDMA side of a member's route: it asks the member where
// the batch's Reads are, READs them through the RDMA transport and then
// releases the lease. A Read not placed fails ErrUnsupported (fallback
// carries it over TCP).
type placing struct {
	c      *Cluster
	member string
}

func (p *placing) Name() string { return transportRDMA }

// errNotPlaced reports a page the member did not place in its DRAM.
var errNotPlaced = fmt.Errorf("page not in the member's dram: %w", transfer.ErrUnsupported)

func (p *placing) Submit(ctx context.Context, endpoint string, batch []transfer.RemoteDesc) []transfer.Completion {
	loc, lease, err := p.place(ctx, batch)
	if err != nil {
		loc = batchLocator{err: fmt.Errorf("placement from %s: %v: %w", p.member, err, transfer.ErrUnsupported)}
	}
	t := *p.c.rd.tr
	t.Locate = loc
	out := t.Submit(ctx, p.member, batch)
	if lease != 0 {
		p.release(ctx, lease)
	}
	return out
}

// place asks the member for the placements of batch's Reads by content
// (all of one layout and size: a load's).
func (p *placing) place(ctx context.Context, batch []transfer.RemoteDesc) (batchLocator, uint64, error) {
	req := &pb.PlaceRequest{From: p.c.name}
	var keys []pagekey.Key
	var layout pagekey.Fingerprint
	for _, d := range batch {
		if d.Op != transfer.Read || d.Remote.RKey != 0 {
			continue
		}
		if len(keys) == 0 {
			layout, req.Size = d.Remote.Layout, d.Len
			req.Layout = layout[:]
		} else if d.Remote.Layout != layout || req.Size != d.Len {
			return batchLocator{}, 0, errors.New("a batch of several layouts or sizes")
		}
		keys = append(keys, d.Remote.Page)
		req.Keys = append(req.Keys, d.Remote.Page[:]...)
	}
	if len(keys) == 0 {
		return batchLocator{}, 0, nil
	}
	if len(keys) > placeMaxKeys {
		return batchLocator{}, 0, fmt.Errorf("%d pages in one batch, at most %d", len(keys), placeMaxKeys)
	}
	cl, err := p.c.peerClient(p.member)
	if err != nil {
		return batchLocator{}, 0, err
	}
	cctx, cancel := context.WithTimeout(ctx, placeCallWithin)
	defer cancel()
	resp, err := cl.PlacePages(cctx, req)
	if err != nil {
		return batchLocator{}, 0, err
	}
	if len(resp.Pages) != len(keys) {
		p.release(ctx, resp.Lease)
		return batchLocator{}, 0, fmt.Errorf("%d placements for %d pages", len(resp.Pages), len(keys))
	}
	loc := batchLocator{at: make(map[pagekey.Key]trdma.Placement, len(keys))}
	for i, pp := range resp.Pages {
		if pp.InDram {
			loc.at[keys[i]] = trdma.Placement{Region: pp.Region, Off: pp.Offset, Header: page.Header{Key: keys[i],
				Layout: layout, Length: pp.Length, Checksum: pp.Checksum, Generation: pp.Generation}}
		}
	}
	return loc, resp.Lease, nil
}

// release ends a lease; a failure leaves it to expire.
func (p *placing) release(ctx context.Context, lease uint64) {
	if lease == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), placeReleaseWithin)
	defer cancel()
	cl, err := p.c.peerClient(p.member)
	if err == nil {
		_, err = cl.ReleasePlacements(ctx, &pb.ReleasePlacementsRequest{From: p.c.name, Lease: lease})
	}
	if err != nil {
		p.c.log.Warn().Str("member", p.member).Err(err).Msg("rdma: releasing a placement lease failed; it expires")
	}
}

// batchLocator is one batch's placements (or why there are none).
type batchLocator struct {
	at  map[pagekey.Key]trdma.Placement
	err error
}

func (l batchLocator) Locate(_ context.Context, _ string, d transfer.RemoteDesc) (trdma.Placement, error) {
	if l.err != nil {
		return trdma.Placement{}, l.err
	}
	p, ok := l.at[d.Remote.Page]
	if !ok {
		return trdma.Placement{}, fmt.Errorf("page %s: %w", d.Remote.Page, errNotPlaced)
	}
	return p, nil
}

// peerClient is the peer service of member.
func (c *Cluster) peerClient(member string) (pb.PeerServiceClient, error) {
	c.mu.Lock()
	addr := ""
	if o := c.origins[member]; o != nil {
		addr = o.peerAddr
	}
	c.mu.Unlock()
	if addr == "" {
		return nil, fmt.Errorf("member %s left", member)
	}
	cc, err := c.peerConn(addr)
	if err != nil {
		return nil, err
	}
	return pb.NewPeerServiceClient(cc), nil
}
