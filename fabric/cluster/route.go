package cluster

import (
	"cmp"
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// Routing: which members hold how many leading pages of a chain, in which
// tiers. The gossiped index says who announced each page (not its tier: a
// demotion is not announced); each candidate confirms its run and tiers
// over the peer service (Holds), so a router never acts on a stale run
// without being told ("confirmed": false).

// Member states a route reports.
const (
	RouteAlive   = "alive"   // in the view, its index current here, and it confirmed
	RouteSuspect = "suspect" // in the view, but it did not confirm, or this peer's index of it is behind
)

// holdsDeadline bounds a confirmation when the caller's context has none.
const holdsDeadline = time.Second

// Holder is one host holding a leading run of a chain.
type Holder struct {
	Name               string
	Self               bool
	State              string // RouteAlive or RouteSuspect
	Pages              int    // it holds pages 0..Pages-1
	Runs               []catalog.Run
	Confirmed          bool // the host answered for its run (false: the gossiped index only; runs are TierNone)
	PeerAddr, DataAddr string

	origin int // its origin id here (the index's silent list)
}

// dramLead is how many of h's leading pages are in DRAM before anything
// slower.
func (h Holder) dramLead() int {
	if len(h.Runs) > 0 && h.Runs[0].Tier == catalog.TierDRAM {
		return h.Runs[0].Pages
	}
	return 0
}

// Rank orders holders best first: more leading pages; then alive before
// suspect; then more leading pages in DRAM; then the asking peer itself
// (no hop); then by name, so every peer ranks the same answers the same.
// Holders of no page are dropped.
func Rank(hs []Holder) []Holder {
	hs = slices.DeleteFunc(hs, func(h Holder) bool { return h.Pages <= 0 })
	slices.SortStableFunc(hs, func(a, b Holder) int {
		if c := cmp.Compare(b.Pages, a.Pages); c != 0 {
			return c
		}
		if a.State != b.State {
			if a.State == RouteAlive {
				return -1
			}
			if b.State == RouteAlive {
				return 1
			}
		}
		if c := cmp.Compare(b.dramLead(), a.dramLead()); c != 0 {
			return c
		}
		if a.Self != b.Self {
			if a.Self {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Name, b.Name)
	})
	return hs
}

// Holders returns the other members that announced a leading run of keys,
// each confirmed by the member itself: its own count and tiers replace the
// gossiped count (a member that holds fewer than announced answers fewer;
// one that holds none is dropped). A member that does not answer within
// ctx's deadline (a second when it has none) is kept with the gossiped
// count, unconfirmed, and reported suspect; it is not asked again while
// the index counts it silent (silentTTL, as lookups do), so a router's
// queries do not each wait out a member that stopped answering. Unranked.
func (c *Cluster) Holders(ctx context.Context, keys []pagekey.Key) []Holder {
	keys = keys[:min(len(keys), holdsMaxKeys)]
	held := c.remote.Leading(keys)
	if len(held) == 0 {
		return nil
	}
	out := c.holdersOf(held)
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, holdsDeadline)
		defer cancel()
	}
	var wg sync.WaitGroup
	for i := range out {
		if c.remote.isSilent(out[i].origin) {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			c.confirm(ctx, &out[i], keys[:out[i].Pages])
		}()
	}
	wg.Wait()
	return slices.DeleteFunc(out, func(h Holder) bool { return h.Pages == 0 })
}

// Addrs are the peer service and data plane addresses this peer
// advertises ("" before Start).
func (c *Cluster) Addrs() (peerAddr, dataAddr string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.peerAddr, c.dataAddr
}

// holdersOf names the origins of held that are alive here; their state is
// suspect until they confirm.
func (c *Cluster) holdersOf(held []catalog.Held) []Holder {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []Holder
	for _, h := range held {
		o := c.aliveLocked(h.Origin)
		if o == nil {
			continue
		}
		out = append(out, Holder{Name: o.name, State: RouteSuspect, Pages: h.Pages, PeerAddr: o.peerAddr, DataAddr: o.dataAddr,
			Runs: []catalog.Run{{Tier: catalog.TierNone, Pages: h.Pages}}, origin: o.id})
	}
	return out
}

// confirm asks h for its run of keys and fills in its answer; h stays
// suspect and unconfirmed when it does not answer.
func (c *Cluster) confirm(ctx context.Context, h *Holder, keys []pagekey.Key) {
	tiers, err := c.holds(ctx, h.Name, keys)
	if err != nil {
		c.remote.markSilent(h.origin)
		c.log.Debug().Err(err).Str("member", h.Name).Msg("route: member did not confirm its pages")
		return
	}
	h.Pages, h.Runs, h.Confirmed = len(tiers), catalog.Runs(tiers), true
	if c.current(h.Name) {
		h.State = RouteAlive
	}
}

// current says whether this peer's index of member is complete: a snapshot
// of its current life applied and no hole since.
func (c *Cluster) current(member string) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	o := c.origins[member]
	return o != nil && o.state == stateAlive && o.current && o.synced
}

// holds calls member's Holds.
func (c *Cluster) holds(ctx context.Context, member string, keys []pagekey.Key) ([]catalog.Tier, error) {
	client, err := c.peerClient(member)
	if err != nil {
		return nil, err
	}
	packed := make([]byte, 0, len(keys)*pagekey.Size)
	for _, k := range keys {
		packed = append(packed, k[:]...)
	}
	reply, err := client.Holds(ctx, &pb.HoldsRequest{Keys: packed})
	if err != nil {
		return nil, fmt.Errorf("holds from %s: %w", member, err)
	}
	if len(reply.Tiers) > len(keys) {
		return nil, fmt.Errorf("holds from %s: %d tiers for %d keys", member, len(reply.Tiers), len(keys))
	}
	tiers := make([]catalog.Tier, len(reply.Tiers))
	for i, t := range reply.Tiers {
		switch t {
		case pb.Tier_TIER_DRAM:
			tiers[i] = catalog.TierDRAM
		case pb.Tier_TIER_SSD:
			tiers[i] = catalog.TierSSD
		default:
			return nil, fmt.Errorf("holds from %s: page %d in tier %v", member, i, t)
		}
	}
	return tiers, nil
}

// Holds answers the tiers of the leading asked pages this peer holds
// (catalog.Peek: no lease, no hit counted).
func (s *peerServer) Holds(_ context.Context, req *pb.HoldsRequest) (*pb.HoldsReply, error) {
	if len(req.Keys)%pagekey.Size != 0 || len(req.Keys)/pagekey.Size > holdsMaxKeys {
		return nil, status.Errorf(codes.InvalidArgument, "keys: %d bytes, want a multiple of %d, at most %d keys", len(req.Keys), pagekey.Size, holdsMaxKeys)
	}
	keys := make([]pagekey.Key, len(req.Keys)/pagekey.Size)
	for i := range keys {
		copy(keys[i][:], req.Keys[i*pagekey.Size:])
	}
	reply := &pb.HoldsReply{}
	for _, t := range s.c.cat.Peek(keys) {
		if t == catalog.TierDRAM {
			reply.Tiers = append(reply.Tiers, pb.Tier_TIER_DRAM)
		} else {
			reply.Tiers = append(reply.Tiers, pb.Tier_TIER_SSD)
		}
	}
	return reply, nil
}

// askHolds asks origin how many leading pages of keys it holds (a lookup
// confirming a filter's claim, within ctx).
func (c *Cluster) askHolds(ctx context.Context, origin int, keys []pagekey.Key) (int, error) {
	c.mu.Lock()
	name := ""
	if o := c.aliveLocked(origin); o != nil {
		name = o.name
	}
	c.mu.Unlock()
	if name == "" {
		return 0, fmt.Errorf("origin %d: not a live member", origin)
	}
	tiers, err := c.holds(ctx, name, keys)
	return len(tiers), err
}
