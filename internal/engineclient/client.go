// Package engineclient is a Go client of the peer's engine API, for tools,
// benchmarks and tests that play the engine's part: it creates a shared-memory
// KV buffer in the vLLM FlashAttention layout, opens a session over it and
// runs lookups, saves and loads to completion. Engines themselves use the
// Python package in integration/python.
package engineclient

import (
	"context"
	"errors"
	"fmt"
	"os"
	"time"

	"golang.org/x/sys/unix"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// Dial connects to a peer's Unix socket; a relative path is taken from the
// working directory.
func Dial(socket string) (*grpc.ClientConn, error) {
	target, err := Target(socket)
	if err != nil {
		return nil, err
	}
	return grpc.NewClient(target, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(16<<20)))
}

// Target is the gRPC target of a Unix socket path, relative or absolute:
// "unix:" and the path ("unix://data/x.sock" would name host "data"; making
// the path absolute could push it past the 107 bytes a socket path may have).
func Target(socket string) (string, error) {
	if socket == "" {
		return "", errors.New("empty socket path")
	}
	return "unix:" + socket, nil
}

// Shm is a shared-memory file mapped into this process: the engine's side
// of a KV buffer.
type Shm struct {
	Path string
	Mem  []byte
}

// CreateShm creates (or truncates) the file at path with size bytes and maps it.
func CreateShm(path string, size int) (*Shm, error) {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if err := f.Truncate(int64(size)); err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(int(f.Fd()), 0, size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_POPULATE)
	if err != nil {
		return nil, fmt.Errorf("map %s: %w", path, err)
	}
	return &Shm{Path: path, Mem: mem}, nil
}

// Close unmaps and removes the file.
func (s *Shm) Close() error {
	err := unix.Munmap(s.Mem)
	return errors.Join(err, os.Remove(s.Path))
}

// Flash describes a KV cache in vLLM's FlashAttention layout: per layer one
// (2, NumBlocks, BlockTokens, KVHeads, HeadDim) tensor, layers back to back
// in one buffer.
type Flash struct {
	Layers, NumBlocks, BlockTokens, PageTokens, KVHeads, HeadDim, ElemBytes int
}

// BlockBytes is the size of one block of one (layer, plane).
func (f Flash) BlockBytes() int { return f.BlockTokens * f.KVHeads * f.HeadDim * f.ElemBytes }

// Size is the buffer's size in bytes.
func (f Flash) Size() int { return f.Layers * 2 * f.NumBlocks * f.BlockBytes() }

// BlockOffset is where block b of (layer, plane) starts in the buffer.
func (f Flash) BlockOffset(layer, plane, b int) int {
	return ((layer*2+plane)*f.NumBlocks + b) * f.BlockBytes()
}

// Layout returns the page layout for a model name.
func (f Flash) Layout(model string) *pb.Layout {
	return &pb.Layout{Model: model, Revision: "test", Dtype: map[int]string{1: "fp8_e4m3", 2: "bf16", 4: "fp32"}[f.ElemBytes], NumLayers: uint32(f.Layers),
		KvHeads: uint32(f.KVHeads), HeadDim: uint32(f.HeadDim), TpSize: 1, PageTokens: uint32(f.PageTokens), ByteLayout: "vllm-flash"}
}

// OpenRequest builds the OpenSession request for a buffer at path.
func (f Flash) OpenRequest(model, path string) *pb.OpenSessionRequest {
	r := &pb.OpenSessionRequest{EngineId: "engineclient", Layout: f.Layout(model), BlockTokens: uint32(f.BlockTokens),
		NumBlocks: uint32(f.NumBlocks), Buffers: []*pb.Buffer{{Kind: &pb.Buffer_Shm{Shm: &pb.SharedMemory{Path: path}}, SizeBytes: uint64(f.Size())}}}
	for l := 0; l < f.Layers; l++ {
		for p := 0; p < 2; p++ {
			r.Segments = append(r.Segments, &pb.Segment{Layer: uint32(l), Plane: uint32(p), Offset: uint64(f.BlockOffset(l, p, 0)),
				BlockStride: uint64(f.BlockBytes()), BlockBytes: uint64(f.BlockBytes())})
		}
	}
	return r
}

// Engine is an open session.
type Engine struct {
	C         pb.EngineServiceClient
	Session   string
	PageBytes uint64
	FP        []byte
	// LayerEvents are the session's per-layer interprocess event handles
	// (CUDA sessions of a peer that supports layer-wise loads).
	LayerEvents [][]byte
}

// Open opens a session.
func Open(ctx context.Context, conn *grpc.ClientConn, req *pb.OpenSessionRequest) (*Engine, error) {
	c := pb.NewEngineServiceClient(conn)
	resp, err := c.OpenSession(ctx, req, grpc.WaitForReady(true))
	if err != nil {
		return nil, err
	}
	return &Engine{C: c, Session: resp.SessionId, PageBytes: resp.PageBytes, FP: resp.LayoutFingerprint, LayerEvents: resp.LayerEvents}, nil
}

// Lookup looks up a key chain.
func (e *Engine) Lookup(ctx context.Context, keys [][]byte, lease bool) (*pb.LookupResponse, error) {
	return e.C.Lookup(ctx, &pb.LookupRequest{SessionId: e.Session, Keys: keys, Lease: lease})
}

// Save saves pages and returns the per-page results: one call that waits
// (SaveRequest.wait).
func (e *Engine) Save(ctx context.Context, pages []*pb.PageRef, d pb.Durability) (*pb.OpStatus, error) {
	h, err := e.C.Save(ctx, &pb.SaveRequest{SessionId: e.Session, Pages: pages, Durability: d, Wait: true})
	return e.finished(ctx, h, err)
}

// Load loads pages and returns the per-page results: one call that waits
// (LoadRequest.wait).
func (e *Engine) Load(ctx context.Context, pages []*pb.PageRef) (*pb.OpStatus, error) {
	h, err := e.C.Load(ctx, &pb.LoadRequest{SessionId: e.Session, Pages: pages, Wait: true})
	return e.finished(ctx, h, err)
}

// finished returns the status a waiting call answered with, or waits for it
// (a peer that predates wait answers with the handle only).
func (e *Engine) finished(ctx context.Context, h *pb.OpHandle, err error) (*pb.OpStatus, error) {
	switch {
	case err != nil:
		return nil, err
	case h.Status.GetDone():
		return h.Status, nil
	}
	return e.Wait(ctx, h.OpId)
}

// Wait polls an operation until it is done or ctx ends.
func (e *Engine) Wait(ctx context.Context, op string) (*pb.OpStatus, error) {
	for {
		st, err := e.C.Wait(ctx, &pb.WaitRequest{SessionId: e.Session, OpId: op, TimeoutMs: 1000})
		if err != nil {
			return nil, err
		}
		if st.Done {
			return st, nil
		}
	}
}

// Close closes the session.
func (e *Engine) Close(ctx context.Context) error {
	_, err := e.C.CloseSession(ctx, &pb.CloseSessionRequest{SessionId: e.Session})
	return err
}

// KeepAlive sends keepalives every interval until ctx ends.
func (e *Engine) KeepAlive(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			cctx, cancel := context.WithTimeout(ctx, interval)
			_, _ = e.C.Keepalive(cctx, &pb.KeepaliveRequest{SessionId: e.Session})
			cancel()
		}
	}
}

// AllOK returns an error naming the first page that did not succeed.
func AllOK(st *pb.OpStatus) error {
	for i, p := range st.Pages {
		if p.Code != pb.PageCode_PAGE_OK {
			return fmt.Errorf("page %d: %s %s", i, p.Code, p.Message)
		}
	}
	return nil
}
