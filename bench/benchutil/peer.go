package benchutil

import (
	"context"
	"flag"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// Engine is an in-process peer plus an engine session over its socket.
type Engine struct {
	E     *engineclient.Engine  // the session, as an engine holds it
	Admin pb.AdminServiceClient // the peer's admin API on the same connection
	Shm   *engineclient.Shm     // the engine's KV buffer the peer maps
	Stop  func()                // closes the connection, stops the peer, removes the buffer
}

// StartPeer starts a peer in-process from cfg (validated here; its
// data directory is emptied first), creates the engine's shared-memory KV
// buffer of flash's geometry at shmPath (zeroed: the caller fills it) and
// opens one session over the peer's Unix socket, as an engine does. stop
// closes the connection, stops the peer and removes the buffer.
func StartPeer(ctx context.Context, cfg fabric.Config, flash engineclient.Flash, shmPath string) (*Engine, error) {
	os.RemoveAll(cfg.DataDir)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	peer, err := fabric.New(cfg, zerolog.Nop())
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- peer.Run(pctx) }()
	stop := func() { cancel(); <-done }
	shm, err := engineclient.CreateShm(shmPath, flash.Size())
	if err != nil {
		stop()
		return nil, err
	}
	conn, err := engineclient.Dial(cfg.Socket)
	if err != nil {
		stop()
		shm.Close()
		return nil, err
	}
	octx, ocancel := context.WithTimeout(ctx, 30*time.Second)
	defer ocancel()
	e, err := engineclient.Open(octx, conn, flash.OpenRequest("bench", shm.Path))
	if err != nil {
		conn.Close()
		stop()
		shm.Close()
		return nil, err
	}
	return &Engine{E: e, Admin: pb.NewAdminServiceClient(conn), Shm: shm, Stop: func() { conn.Close(); stop(); shm.Close() }}, nil
}

// FlashPageBytes is the bytes of one page of f's geometry: every layer's K
// and V blocks of the page's tokens.
func FlashPageBytes(f engineclient.Flash) uint64 {
	return uint64(f.Layers) * 2 * uint64(f.BlockBytes()) * uint64(f.PageTokens/f.BlockTokens)
}

// Qwen3Flash is the benches' default page geometry: Qwen3-8B (36 layers, 8
// KV heads of 128, bf16) in 16-token blocks, 64-token (9 MiB) pages.
func Qwen3Flash() engineclient.Flash {
	return engineclient.Flash{Layers: 36, BlockTokens: 16, PageTokens: 64, KVHeads: 8, HeadDim: 128, ElemBytes: 2}
}

// GeometryFlags lets --layers, --kv-heads and --head-dim change f.
func GeometryFlags(fs *flag.FlagSet, f *engineclient.Flash) {
	fs.IntVar(&f.Layers, "layers", f.Layers, "layers of the page geometry (default: Qwen3-8B)")
	fs.IntVar(&f.KVHeads, "kv-heads", f.KVHeads, "KV heads")
	fs.IntVar(&f.HeadDim, "head-dim", f.HeadDim, "head dimension")
}
