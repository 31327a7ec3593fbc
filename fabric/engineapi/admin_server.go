package engineapi

import (
	"context"
	"fmt"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/fabric/cluster"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// adminServer implements pb.AdminServiceServer.
type adminServer struct {
	pb.UnimplementedAdminServiceServer
	p *API
}

// Idle reports whether no lease, operation or SSD I/O is outstanding.
func (p *API) idle() (bool, string) {
	leases, ops := 0, 0
	for _, s := range p.sessions.list() {
		s.mu.Lock()
		leases += len(s.mu.leases)
		ops += len(s.mu.ops)
		s.mu.Unlock()
	}
	var ssdInflight int64
	if p.ssd != nil {
		ssdInflight = p.ssd.Stats().InFlight
	}
	b := p.pages.Backlog()
	leased, unsealed := b.LeasedBytes, b.UnsealedPages
	idle := leases == 0 && leased == 0 && ssdInflight == 0 && p.runningOps() == 0 && unsealed == 0
	return idle, fmt.Sprintf("leases=%d leased_bytes=%d unwaited_ops=%d running_ops=%d ssd_inflight=%d unsealed_pages=%d",
		leases, leased, ops, p.runningOps(), ssdInflight, unsealed)
}

func (p *API) runningOps() int {
	n := 0
	for _, s := range p.sessions.list() {
		s.mu.Lock()
		for _, o := range s.mu.ops {
			select {
			case <-o.done:
			default:
				n++
			}
		}
		s.mu.Unlock()
	}
	return n
}

func (s *adminServer) Status(context.Context, *pb.StatusRequest) (*pb.StatusResponse, error) {
	p := s.p
	ps := p.pages.PoolStats()
	problem := p.health(p.now())
	out := &pb.StatusResponse{Healthy: problem == "", Problem: problem, StartRepair: p.startRepair, Version: p.version, UptimeMs: p.now().Sub(p.started).Milliseconds(),
		Sessions: uint32(len(p.sessions.list())), CatalogEntries: uint64(p.cat.Len()), InflightOps: uint32(p.runningOps())}
	ssdPages := p.pages.Backlog().SSDPages
	out.Tiers = append(out.Tiers, &pb.TierStatus{Tier: pb.Tier_TIER_DRAM, CapacityBytes: ps.CapacityBytes, UsedBytes: ps.UsedBytes, Pages: uint64(ps.Slots)})
	if p.ssd != nil {
		st := p.ssd.Stats()
		out.Tiers = append(out.Tiers, &pb.TierStatus{Tier: pb.Tier_TIER_SSD, CapacityBytes: st.CapacityBytes, UsedBytes: st.UsedBytes, Pages: uint64(ssdPages)})
	}
	for _, sess := range p.sessions.list() {
		sess.mu.Lock()
		out.Leases += uint32(len(sess.mu.leases))
		sess.mu.Unlock()
	}
	return out, nil
}

func (s *adminServer) CatalogLookup(_ context.Context, r *pb.CatalogLookupRequest) (*pb.CatalogLookupResponse, error) {
	keys, err := keysFromPB(r.Keys, s.p.cfg.MaxKeys)
	if err != nil {
		return nil, toStatus(err)
	}
	res := s.p.cat.Lookup(keys, s.p.now().UnixNano())
	out := &pb.CatalogLookupResponse{HitPages: uint32(res.Hit)}
	for _, t := range res.Tiers {
		out.Tiers = append(out.Tiers, tierToPB(t))
	}
	return out, nil
}

func (s *adminServer) Evict(ctx context.Context, r *pb.EvictRequest) (*pb.EvictResponse, error) {
	keys, err := keysFromPB(r.Keys, s.p.cfg.MaxKeys)
	if err != nil {
		return nil, toStatus(err)
	}
	var tier catalog.Tier
	switch r.Tier {
	case pb.Tier_TIER_DRAM:
		tier = catalog.TierDRAM
	case pb.Tier_TIER_SSD:
		tier = catalog.TierSSD
	default:
		return nil, toStatus(invalid("evict needs tier DRAM or SSD"))
	}
	n, err := s.p.pages.Evict(ctx, tier, keys)
	if err != nil {
		return nil, toStatus(err)
	}
	return &pb.EvictResponse{EvictedPages: uint64(n)}, nil
}

func (s *adminServer) Drain(ctx context.Context, r *pb.DrainRequest) (*pb.DrainResponse, error) {
	deadline := time.Now().Add(min(durationMs(r.TimeoutMs, 10*time.Second), maxWait))
	for {
		idle, detail := s.p.idle()
		if idle || time.Now().After(deadline) || ctx.Err() != nil {
			s.p.pages.UpdateGauges()
			return &pb.DrainResponse{Idle: idle, Detail: detail}, nil
		}
		select {
		case <-ctx.Done():
		case <-time.After(20 * time.Millisecond):
		}
	}
}

func (s *adminServer) Peers(context.Context, *pb.PeersRequest) (*pb.PeersResponse, error) {
	c := s.p.cluster
	if c == nil {
		return &pb.PeersResponse{}, nil
	}
	var peers []*pb.PeerInfo
	for _, m := range c.Peers(uint64(s.p.cat.Len())) {
		peers = append(peers, peerToPB(m))
	}
	return &pb.PeersResponse{Clustered: true, Cluster: c.Name(), Peers: peers}, nil
}

func peerToPB(m cluster.Member) *pb.PeerInfo {
	out := &pb.PeerInfo{Name: m.Name, GossipAddr: m.GossipAddr, PeerAddr: m.PeerAddr, DataAddr: m.DataAddr,
		State: m.State, Self: m.Self, Pages: m.Pages, Incarnation: m.Incarnation,
		Transport: m.Transport, TransportReason: m.TransportWhy}
	if !m.SyncedAt.IsZero() {
		out.SyncedUnixMs = m.SyncedAt.UnixMilli()
	}
	return out
}
