package cluster

import (
	"context"
	"errors"
	"fmt"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
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
// transport.go), which promotes SSD pages. The member's side (the leases)
// is in lease.go, its handlers in run.go, the registration in rdma.go.

// Placer is what the store gives this peer's placements: its DRAM region
// and the pages in it (fabric/store's *Store implements it; the data plane
// Source passed to Start is checked for it).
type Placer interface {
	DRAMRegion() *transfer.Region
	PlaceDRAM(wants []tcp.Want) ([]transfer.Placed, func())
}

// placing is the RDMA side of a member's route: it asks the member where
// the batch's Reads are, READs them through the RDMA transport and then
// releases the lease. A Read not placed fails ErrUnsupported (fallback
// carries it over TCP).
type placing struct {
	member string
	from   string           // this peer's name, sent with the calls
	tr     *trdma.Transport // the RDMA transport (its Locate is set per batch)
	client func(member string) (pb.PeerServiceClient, error)
	log    zerolog.Logger
}

func (p *placing) Name() string { return transportRDMA }

// errNotPlaced reports a page the member did not place in its DRAM.
var errNotPlaced = fmt.Errorf("page not in the member's dram: %w", transfer.ErrUnsupported)

func (p *placing) Submit(ctx context.Context, endpoint string, batch []transfer.RemoteDesc) []transfer.Completion {
	loc, lease, err := p.place(ctx, batch)
	if err != nil {
		loc = batchLocator{err: fmt.Errorf("placement from %s: %v: %w", p.member, err, transfer.ErrUnsupported)}
	}
	t := *p.tr
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
	req := &pb.PlaceRequest{From: p.from}
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
	cl, err := p.client(p.member)
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
	cl, err := p.client(p.member)
	if err == nil {
		_, err = cl.ReleasePlacements(ctx, &pb.ReleasePlacementsRequest{From: p.from, Lease: lease})
	}
	if err != nil {
		p.log.Warn().Str("member", p.member).Err(err).Msg("rdma: releasing a placement lease failed; it expires")
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
