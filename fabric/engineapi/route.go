package engineapi

import (
	"context"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/fabric/cluster"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// Route answers which hosts hold how many leading pages of a prompt, best
// first (cluster.Rank): this peer from its own catalog, the other members
// from the gossiped index, each confirmed by the member (cluster.Holders).
// Nothing is leased or touched: a router asks before it picks a host, and
// the engine there looks the prompt up as usual. The admin service's Route
// and the metrics listener's POST /v1/route both answer from it.
func (p *API) Route(ctx context.Context, r *pb.RouteRequest) (*pb.RouteResponse, error) {
	keys, err := routeKeys(r, p.cfg.MaxKeys)
	if err != nil {
		return nil, toStatus(err)
	}
	self := cluster.Holder{Self: true, State: cluster.RouteAlive, Confirmed: true}
	tiers := p.cat.Peek(keys)
	self.Pages, self.Runs = len(tiers), catalog.Runs(tiers)
	var hs []cluster.Holder
	if p.cluster != nil {
		self.Name = p.cluster.Name()
		self.PeerAddr, self.DataAddr = p.cluster.Addrs()
		hs = p.cluster.Holders(ctx, keys)
	}
	out := &pb.RouteResponse{PromptPages: uint32(len(keys))}
	for _, h := range cluster.Rank(append(hs, self)) {
		out.Hosts = append(out.Hosts, holderToPB(h))
	}
	return out, nil
}

// Route is the admin service's Route (API.Route).
func (s *adminServer) Route(ctx context.Context, r *pb.RouteRequest) (*pb.RouteResponse, error) {
	return s.p.Route(ctx, r)
}

// routeKeys is the request's chain: its keys, or the keys of its tokens'
// whole pages under its layout. Exactly one of the two is given.
func routeKeys(r *pb.RouteRequest, limit int) ([]pagekey.Key, error) {
	switch {
	case len(r.Keys) > 0 && (r.Layout != nil || len(r.Tokens) > 0):
		return nil, invalid("route takes keys or layout and tokens, not both")
	case len(r.Keys) > 0:
		return keysFromPB(r.Keys, limit)
	case r.Layout == nil:
		return nil, invalid("route needs keys, or a layout with tokens")
	}
	l, err := layoutFromPB(r.Layout)
	if err != nil {
		return nil, err
	}
	if n := len(r.Tokens) / int(l.PageTokens); n > limit {
		return nil, invalid("%d pages of tokens, limit %d", n, limit)
	}
	return pagekey.Chain(l.Fingerprint(), int(l.PageTokens), r.Tokens), nil
}

func holderToPB(h cluster.Holder) *pb.HostRoute {
	out := &pb.HostRoute{Name: h.Name, Self: h.Self, State: h.State, Pages: uint32(h.Pages), Confirmed: h.Confirmed,
		PeerAddr: h.PeerAddr, DataAddr: h.DataAddr}
	for _, r := range h.Runs {
		out.Runs = append(out.Runs, &pb.RouteRun{Tier: tierToPB(r.Tier), Pages: uint32(r.Pages)})
	}
	return out
}
