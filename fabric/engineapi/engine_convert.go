package engineapi

import (
	"fmt"
	"github.com/orbitkv/orbitkv/fabric/store"
	"path/filepath"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/hbm"
	"github.com/orbitkv/orbitkv/transfer"
)

// The engine API's conversions between generated types and the peer's own.
// Every request from outside is validated here before it reaches anything.

const (
	maxLayers     = 1024
	maxHeads      = 1024  // KV heads on one rank
	maxHeadDim    = 65536 // elements
	maxBuffers    = 4096
	maxStringLen  = 512
	maxPageTokens = 1 << 16
	// maxKeepalive caps a session's keepalive: an engine that dies is
	// noticed, and its mapping, leases and operations released, within it.
	maxKeepalive = 10 * time.Minute
)

func invalid(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

func layoutFromPB(l *pb.Layout) (pagekey.Layout, error) {
	if l == nil {
		return pagekey.Layout{}, invalid("layout is required")
	}
	out := pagekey.Layout{Model: l.Model, Revision: l.Revision, DType: l.Dtype, NumLayers: l.NumLayers,
		KVHeads: l.KvHeads, HeadDim: l.HeadDim, TPRank: l.TpRank, TPSize: l.TpSize, PageTokens: l.PageTokens, ByteLayout: l.ByteLayout}
	switch {
	case out.Model == "" || out.DType == "" || out.ByteLayout == "":
		return out, invalid("layout needs model, dtype and byte_layout")
	case len(out.Model) > maxStringLen || len(out.Revision) > maxStringLen || len(out.DType) > maxStringLen || len(out.ByteLayout) > maxStringLen:
		return out, invalid("layout strings are limited to %d bytes", maxStringLen)
	case out.NumLayers == 0 || out.NumLayers > maxLayers:
		return out, invalid("num_layers %d out of range 1..%d", out.NumLayers, maxLayers)
	case out.KVHeads == 0 || out.HeadDim == 0 || out.KVHeads > maxHeads || out.HeadDim > maxHeadDim:
		return out, invalid("kv_heads %d and head_dim %d must be in 1..%d and 1..%d", out.KVHeads, out.HeadDim, maxHeads, maxHeadDim)
	case out.TPSize == 0 || out.TPRank >= out.TPSize:
		return out, invalid("tp_rank %d of tp_size %d", out.TPRank, out.TPSize)
	case out.PageTokens == 0 || out.PageTokens > maxPageTokens:
		return out, invalid("page_tokens %d out of range 1..%d", out.PageTokens, maxPageTokens)
	}
	return out, nil
}

// sessionFromPB validates an OpenSession request.
func sessionFromPB(r *pb.OpenSessionRequest, defKeepalive time.Duration) (sessionSpec, error) {
	var spec sessionSpec
	layout, err := layoutFromPB(r.Layout)
	if err != nil {
		return spec, err
	}
	spec.layout, spec.engineID, spec.recompute = layout, r.EngineId, float64(r.RecomputeTokensPerS)
	if len(spec.engineID) > maxStringLen {
		return spec, invalid("engine_id longer than %d bytes", maxStringLen)
	}
	if ka := time.Duration(r.KeepaliveMs) * time.Millisecond; ka > maxKeepalive {
		return spec, invalid("keepalive_ms %d above the cap of %d (%v): a dead engine's session would hold its buffers and leases that long", r.KeepaliveMs, maxKeepalive.Milliseconds(), maxKeepalive)
	}
	if r.BlockTokens == 0 || layout.PageTokens%r.BlockTokens != 0 {
		return spec, invalid("block_tokens %d must divide page_tokens %d", r.BlockTokens, layout.PageTokens)
	}
	if len(r.Buffers) == 0 && len(r.Segments) == 0 && r.NumBlocks == 0 {
		// A lookup-only session (a scheduler process): no buffers to map;
		// the page size, for the query budget, follows from the layout.
		elem, ok := pagekey.DTypeBytes(layout.DType)
		if !ok {
			return spec, invalid("lookup-only session: unknown dtype %q (known: bf16, fp16, fp32, fp8_e4m3, fp8_e5m2)", layout.DType)
		}
		spec.pageBytes = uint64(layout.NumLayers) * 2 * uint64(layout.PageTokens) * uint64(layout.KVHeads) * uint64(layout.HeadDim) * elem
		spec.keepalive = durationMs(r.KeepaliveMs, defKeepalive)
		return spec, nil
	}
	if len(r.Buffers) == 0 || len(r.Buffers) > maxBuffers {
		return spec, invalid("%d buffers, want 1..%d", len(r.Buffers), maxBuffers)
	}
	sizes := make([]uint64, len(r.Buffers))
	for i, b := range r.Buffers {
		sizes[i] = b.SizeBytes
		if c := b.GetCuda(); c != nil {
			cs, err := cudaFromPB(i, c, b.SizeBytes)
			if err != nil {
				return spec, err
			}
			spec.cuda = append(spec.cuda, cs)
			continue
		}
		shm := b.GetShm()
		if shm == nil {
			return spec, invalid("buffer %d: neither shared memory nor CUDA IPC", i)
		}
		if !filepath.IsAbs(shm.Path) {
			return spec, invalid("buffer %d: path %q is not absolute", i, shm.Path)
		}
		spec.shm = append(spec.shm, shmSpec{path: shm.Path, size: b.SizeBytes})
	}
	if len(spec.cuda) > 0 && len(spec.shm) > 0 {
		return spec, invalid("%d CUDA and %d shared-memory buffers: a session's buffers are all of one kind", len(spec.cuda), len(spec.shm))
	}
	spec.geom, err = geometryFromPB(r, layout, sizes)
	if err != nil {
		return spec, err
	}
	spec.keepalive = durationMs(r.KeepaliveMs, defKeepalive)
	return spec, nil
}

// durabilityFromPB says whether a save must reach SSD before it is
// acknowledged; a value the peer does not know is refused, never taken as
// DRAM (an engine asking for more durability than it gets would lose pages).
func durabilityFromPB(d pb.Durability) (toSSD bool, err error) {
	switch d {
	case pb.Durability_DURABILITY_UNSPECIFIED, pb.Durability_DURABILITY_DRAM:
		return false, nil
	case pb.Durability_DURABILITY_SSD:
		return true, nil
	}
	return false, invalid("unknown durability %d (known: 0 unspecified = dram, 1 dram, 2 ssd)", int32(d))
}

// cudaFromPB validates a CUDA IPC buffer: a 64-byte handle (PyTorch's
// 66-byte form, with its version and kind bytes, is refused with a hint), a
// device ordinal and a non-empty range. Whether the handle opens, the device
// exists and the range fits the allocation is checked when it is imported.
func cudaFromPB(i int, c *pb.CudaIpc, size uint64) (cudaSpec, error) {
	switch {
	case len(c.Handle) != hbm.IPCHandleBytes:
		return cudaSpec{}, invalid("buffer %d: CUDA IPC handle of %d bytes, want %d (strip PyTorch's version and kind bytes)", i, len(c.Handle), hbm.IPCHandleBytes)
	case c.Device < 0:
		return cudaSpec{}, invalid("buffer %d: CUDA device %d", i, c.Device)
	case size == 0 || c.Offset+size < c.Offset:
		return cudaSpec{}, invalid("buffer %d: CUDA buffer of %d bytes at offset %d", i, size, c.Offset)
	}
	return cudaSpec{handle: append([]byte(nil), c.Handle...), device: int(c.Device), offset: c.Offset, size: size}, nil
}

// geometryFromPB checks that the segments are exactly one per (layer, plane)
// and fit their buffers, and orders them layer-major, K before V.
func geometryFromPB(r *pb.OpenSessionRequest, l pagekey.Layout, sizes []uint64) (transfer.Geometry, error) {
	g := transfer.Geometry{NumBlocks: r.NumBlocks, BlocksPerPage: int(l.PageTokens / r.BlockTokens)}
	want := int(l.NumLayers) * 2
	if len(r.Segments) != want {
		return g, invalid("%d segments, want num_layers*2 = %d", len(r.Segments), want)
	}
	g.Segments = make([]transfer.Segment, want)
	seen := make([]bool, want)
	for i, s := range r.Segments {
		if s.Layer >= l.NumLayers || s.Plane > 1 {
			return g, invalid("segment %d: layer %d plane %d out of range", i, s.Layer, s.Plane)
		}
		at := int(s.Layer)*2 + int(s.Plane)
		if seen[at] {
			return g, invalid("segment %d: layer %d plane %d given twice", i, s.Layer, s.Plane)
		}
		seen[at] = true
		g.Segments[at] = transfer.Segment{Buffer: int(s.Buffer), Offset: s.Offset, Stride: s.BlockStride, BlockBytes: s.BlockBytes}
	}
	if err := g.Validate(sizes); err != nil {
		return g, err
	}
	return g, nil
}

// keysFromPB converts a key chain.
func keysFromPB(in [][]byte, limit int) ([]pagekey.Key, error) {
	if len(in) > limit {
		return nil, invalid("%d keys, limit %d", len(in), limit)
	}
	out := make([]pagekey.Key, len(in))
	for i, b := range in {
		k, err := pagekey.FromBytes(b)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		out[i] = k
	}
	return out, nil
}

// pagesFromPB converts and validates a Save/Load page list. Only a load
// (load true) may name transfer.SkipBlock for a block the engine holds.
func pagesFromPB(in []*pb.PageRef, sess *session, limit int, load bool) ([]store.PageReq, error) {
	if len(sess.Bufs) == 0 {
		return nil, fmt.Errorf("%w: session %s registered no kv buffers (lookup-only)", errLayoutMismatch, sess.id)
	}
	if len(in) == 0 || len(in) > limit {
		return nil, invalid("%d pages, want 1..%d", len(in), limit)
	}
	out := make([]store.PageReq, len(in))
	seen := make(map[pagekey.Key]int, len(in))
	for i, r := range in {
		k, err := pagekey.FromBytes(r.Key)
		if err != nil {
			return nil, fmt.Errorf("page %d: %w", i, err)
		}
		if j, dup := seen[k]; dup && !load {
			return nil, invalid("page %d: key %s already given as page %d", i, k, j)
		}
		seen[k] = i
		if !load && transfer.HasSkip(r.Blocks) {
			return nil, invalid("page %d: a save cannot skip blocks (0xFFFFFFFF)", i)
		}
		if err := sess.Geom.CheckBlocks(r.Blocks); err != nil {
			return nil, fmt.Errorf("page %d: %w", i, err)
		}
		out[i] = store.PageReq{Key: k, Blocks: r.Blocks}
	}
	return out, nil
}

func tierToPB(t catalog.Tier) pb.Tier {
	switch t {
	case catalog.TierDRAM:
		return pb.Tier_TIER_DRAM
	case catalog.TierSSD:
		return pb.Tier_TIER_SSD
	case catalog.TierRemote:
		return pb.Tier_TIER_REMOTE
	}
	return pb.Tier_TIER_UNSPECIFIED
}

var codeToPB = map[store.Code]pb.PageCode{
	store.CodePending: pb.PageCode_PAGE_PENDING, store.CodeOK: pb.PageCode_PAGE_OK, store.CodeNotFound: pb.PageCode_PAGE_NOT_FOUND,
	store.CodeCorrupt: pb.PageCode_PAGE_CORRUPT, store.CodeNoSpace: pb.PageCode_PAGE_NO_SPACE, store.CodeDeadline: pb.PageCode_PAGE_DEADLINE,
	store.CodeIOError: pb.PageCode_PAGE_IO_ERROR, store.CodeCancelled: pb.PageCode_PAGE_CANCELLED,
}

func statusToPB(o *op, done bool) *pb.OpStatus {
	st := &pb.OpStatus{OpId: o.id, Done: done}
	if !done {
		return st
	}
	st.Pages = make([]*pb.PageResult, len(o.results))
	for i, r := range o.results {
		st.Pages[i] = &pb.PageResult{Code: codeToPB[r.Code], Tier: tierToPB(r.Tier), Message: r.Msg}
	}
	return st
}

func durationMs(ms uint32, def time.Duration) time.Duration {
	if ms == 0 {
		return def
	}
	return time.Duration(ms) * time.Millisecond
}
