package rdma

import (
	"context"
	"fmt"
	"sync"

	"github.com/orbitkv/orbitkv/internal/page"
	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
)

// ErrUnregistered reports a descriptor whose local region the engine has
// not registered. It wraps transfer.ErrUnsupported: another transport may
// still carry the descriptor.
var ErrUnregistered = fmt.Errorf("rdma transport: local region not registered: %w", transfer.ErrUnsupported)

// Placement is where a member holds a page it serves to RDMA READs: the
// key of one of the regions in its ConnInfo, the page's offset in it, and
// the page's header (which the member gave out with the offset).
type Placement struct {
	Region uint32
	Off    uint64
	Header page.Header
}

// Locator resolves a Read descriptor's remote key to its placement at
// endpoint; a page the member does not hold is an error wrapping
// transfer.ErrRemoteNotFound. It is safe for concurrent use.
type Locator interface {
	Locate(ctx context.Context, endpoint string, d transfer.RemoteDesc) (Placement, error)
}

// Transport is transfer.Transport over the members' RDMA connections
// (transfer.Transport's contract; the mapping is in doc.go). It is safe for
// concurrent use: a Conn runs one batch at a time, so concurrent Submits to
// one member queue on its Conn.
type Transport struct {
	// Conn returns the connection that reaches endpoint.
	Conn func(endpoint string) (*ibv.Conn, error)
	// Locate places Read descriptors (nil: a Read fails ErrUnsupported).
	Locate Locator
	// Regions maps local regions to their registrations.
	Regions *Registry
}

// Name is the transport's name in metrics and `orbitkv peers`.
func (t *Transport) Name() string { return "rdma" }

// Submit runs batch on endpoint's connection: Reads as one Conn.Read,
// Writes as one Conn.Write, one Completion per descriptor in batch order.
func (t *Transport) Submit(ctx context.Context, endpoint string, batch []transfer.RemoteDesc) []transfer.Completion {
	out := make([]transfer.Completion, len(batch))
	if err := ctx.Err(); err != nil {
		return failAll(out, fmt.Errorf("rdma transport: %w", err))
	}
	conn, err := t.Conn(endpoint)
	if err != nil {
		return failAll(out, fmt.Errorf("rdma transport to %s: %w", endpoint, err))
	}
	for _, op := range []transfer.Op{transfer.Read, transfer.Write} {
		idx, ops := t.plan(ctx, endpoint, op, batch, out)
		if len(ops) == 0 {
			continue
		}
		var errs []error
		if op == transfer.Read {
			errs = conn.Read(ctx, ops)
		} else {
			errs = conn.Write(ctx, ops)
		}
		for k, i := range idx {
			if errs[k] != nil {
				out[i].Err = fmt.Errorf("rdma %s %d bytes from %s: %w", op, batch[i].Len, endpoint, errs[k])
			}
		}
	}
	return out
}

// plan maps the descriptors of op to ibv.Ops, setting the Header of Reads
// and the error of a descriptor that cannot be mapped; it returns the
// indexes of the mapped ones beside their Ops.
func (t *Transport) plan(ctx context.Context, endpoint string, op transfer.Op, batch []transfer.RemoteDesc, out []transfer.Completion) ([]int, []ibv.Op) {
	var idx []int
	var ops []ibv.Op
	for i, d := range batch {
		if d.Op != op {
			continue
		}
		o, h, err := t.mapDesc(ctx, endpoint, d)
		if err != nil {
			out[i].Err = fmt.Errorf("rdma descriptor %d: %w", i, err)
			continue
		}
		out[i].Header = h
		idx, ops = append(idx, i), append(ops, o)
	}
	return idx, ops
}

// mapDesc is one descriptor's Op (doc.go's mapping).
func (t *Transport) mapDesc(ctx context.Context, endpoint string, d transfer.RemoteDesc) (ibv.Op, page.Header, error) {
	if d.Len == 0 || d.Local == nil || d.LocalOff > d.Local.Size || d.Len > d.Local.Size-d.LocalOff {
		return ibv.Op{}, page.Header{}, fmt.Errorf("%d bytes at %d: out of the local region", d.Len, d.LocalOff)
	}
	r, ok := t.Regions.Lookup(d.Local)
	if !ok {
		return ibv.Op{}, page.Header{}, fmt.Errorf("%s: %w", d.Local.Name, ErrUnregistered)
	}
	var p Placement
	switch {
	case d.Op == transfer.Write && d.Remote.RKey != 0: // by address
		p = Placement{Region: d.Remote.RKey, Off: d.RemoteOff}
	case d.Op == transfer.Write:
		return ibv.Op{}, page.Header{}, fmt.Errorf("rdma writes by address only: %w", transfer.ErrUnsupported)
	case t.Locate == nil:
		return ibv.Op{}, page.Header{}, fmt.Errorf("rdma reads need page placements, none here: %w", transfer.ErrUnsupported)
	default:
		var err error
		if p, err = t.Locate.Locate(ctx, endpoint, d); err != nil {
			return ibv.Op{}, page.Header{}, err
		}
	}
	seg := ibv.Segment{Region: r, Off: d.LocalOff, Len: d.Len}
	return ibv.Op{Remote: p.Region, RemoteOff: p.Off, Local: []ibv.Segment{seg}}, p.Header, nil
}

func failAll(out []transfer.Completion, err error) []transfer.Completion {
	for i := range out {
		out[i].Err = err
	}
	return out
}

// Registry maps the transfer layer's local regions to their registrations
// with the engine (Engine.RegisterHost for the DRAM pool's slabs,
// Engine.RegisterDevice for engine HBM). Safe for concurrent use.
type Registry struct {
	mu   sync.Mutex
	regs map[*transfer.Region]*ibv.Region
}

// Add records that r is registered as reg.
func (g *Registry) Add(r *transfer.Region, reg *ibv.Region) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.regs == nil {
		g.regs = map[*transfer.Region]*ibv.Region{}
	}
	g.regs[r] = reg
}

// Remove forgets r (before its registration is released).
func (g *Registry) Remove(r *transfer.Region) {
	g.mu.Lock()
	defer g.mu.Unlock()
	delete(g.regs, r)
}

// Lookup returns r's registration.
func (g *Registry) Lookup(r *transfer.Region) (*ibv.Region, bool) {
	if g == nil {
		return nil, false
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	reg, ok := g.regs[r]
	return reg, ok
}
