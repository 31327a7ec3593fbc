// Package restart is `orbitkv bench restart`: it times a peer's start to
// serving. A child `orbitkv serve` is started over a data directory and timed until its socket
// answers a Status call. For each SSD tier size the tier is first filled to
// a fraction with pages saved durably (through an in-process peer), then
// timed after a clean stop (SIGTERM) and after a kill -9, beside a peer
// with no SSD tier; the ratio is to that baseline.
//
// It measures the peer from outside, through its public surface: the
// `orbitkv serve` command line, the admin Status RPC, and the engine API
// (through an in-process fabric peer) for the fill.
package restart

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/fabric"
	"github.com/orbitkv/orbitkv/internal/bytesize"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

type restartBench struct {
	exe      string
	dir      string
	sizes    []uint64
	fill     float64
	fillMax  uint64
	fileSize uint64
	reps     int
	sparse   bool // page files sparse (--ssd-sparse): tiers larger than the free disk
}

// Config is a restart bench's run.
type Config struct {
	Exe       string   // the orbitkv binary whose `serve` is timed
	Dir       string   // directory on the SSD to test; a scratch directory under it is removed at the end
	Sizes     []uint64 // SSD tier sizes, bytes (page files are preallocated unless Sparse)
	Fill      float64  // fraction of each tier filled with saved pages (2 MiB each)
	FillMax   uint64   // at most this many bytes of saved pages per tier
	FileBytes uint64   // size of each page file, bytes
	Reps      int      // timed starts per case (median reported)
	Sparse    bool     // page files sparse (serve --ssd-sparse): tiers larger than the free disk
}

// DefaultConfig is `orbitkv bench restart`'s default run (Exe and Dir left to the caller).
func DefaultConfig() Config {
	return Config{Sizes: []uint64{1 << 30, 8 << 30, 32 << 30}, Fill: 0.05, FillMax: 1 << 30, FileBytes: 1 << 30, Reps: 3}
}

// Run times the starts of cfg.Exe's peer over each tier size and prints
// the table with its no-SSD baseline and the ratios.
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	b := restartBench{exe: cfg.Exe, sizes: cfg.Sizes, fill: cfg.Fill, fillMax: cfg.FillMax, fileSize: cfg.FileBytes, reps: max(1, cfg.Reps), sparse: cfg.Sparse}
	scratch, cleanup, err := benchutil.ScratchDir(cfg.Dir, "restart")
	if err != nil {
		return err
	}
	defer cleanup()
	b.dir = scratch
	return b.run(ctx, out)
}

func (b *restartBench) run(ctx context.Context, out io.Writer) error {
	base := filepath.Join(b.dir, "no-ssd")
	if err := os.MkdirAll(base, 0o700); err != nil {
		return err
	}
	baseClean, err := b.timeStarts(ctx, base, 0, false)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	baseKill, err := b.timeStarts(ctx, base, 0, true)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	fmt.Fprintf(out, "restart to serving (median of %d starts; child `orbitkv serve` until its socket answers Status)\n", b.reps)
	tw := tabwriter.NewWriter(out, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "ssd tier\tsaved pages\tclean ms\tno-ssd ms\tratio\tkill -9 ms\tno-ssd ms\tratio\t")
	defer tw.Flush()
	fmt.Fprintf(tw, "none\t0\t%.1f\t%.1f\t1.00\t%.1f\t%.1f\t1.00\t\n", restartMs(baseClean), restartMs(baseClean), restartMs(baseKill), restartMs(baseKill))
	for _, size := range b.sizes {
		dir := filepath.Join(b.dir, "ssd-"+bytesize.Size(size).String())
		saved, err := b.fillTier(ctx, dir, size)
		if err != nil {
			return fmt.Errorf("fill %s tier: %w", bytesize.Size(size).Human(), err)
		}
		clean, err := b.timeStarts(ctx, dir, size, false)
		if err != nil {
			return err
		}
		kill, err := b.timeStarts(ctx, dir, size, true)
		if err != nil {
			return err
		}
		fmt.Fprintf(tw, "%s\t%d (%s)\t%.1f\t%.1f\t%.2f\t%.1f\t%.1f\t%.2f\t\n", bytesize.Size(size).Human(), saved,
			bytesize.Size(uint64(saved)*restartPageBytes).Human(), restartMs(clean), restartMs(baseClean), restartMs(clean)/restartMs(baseClean),
			restartMs(kill), restartMs(baseKill), restartMs(kill)/restartMs(baseKill))
		os.RemoveAll(dir) // the next tier needs the disk
	}
	return nil
}

func restartMs(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// restartFlash is the fill's geometry: 2 MiB pages, 16 pages a batch.
var restartFlash = engineclient.Flash{Layers: 8, NumBlocks: 64, BlockTokens: 16, PageTokens: 64, KVHeads: 8, HeadDim: 128, ElemBytes: 2}

var restartPageBytes = benchutil.FlashPageBytes(restartFlash)

func (b *restartBench) config(dir string, ssdBytes uint64) fabric.Config {
	cfg := fabric.DefaultConfig()
	cfg.DataDir = dir
	cfg.MetricsAddr = ""
	cfg.CUDA = "off"
	cfg.DRAMBytes, cfg.DRAMSlabBytes = 256<<20, 4<<20
	cfg.SSDBytes, cfg.SSDFileBytes = bytesize.Size(ssdBytes), bytesize.Size(min(b.fileSize, max(ssdBytes, 1)))
	cfg.SSDSparse = b.sparse
	return cfg
}

// fillTier saves pages durably into a fresh data dir with an SSD tier of
// size bytes, through an in-process peer that then stops cleanly.
func (b *restartBench) fillTier(ctx context.Context, dir string, size uint64) (int, error) {
	n := int(min(uint64(b.fill*float64(size)), b.fillMax) / restartPageBytes)
	cfg := b.config(dir, size)
	be, err := benchutil.StartPeer(ctx, cfg, restartFlash, filepath.Join(b.dir, "kv"))
	if err != nil {
		return 0, err
	}
	defer be.Stop()
	rand.Read(be.Shm.Mem)
	per := restartFlash.PageTokens / restartFlash.BlockTokens
	batch := restartFlash.NumBlocks / per
	for done := 0; done < n; {
		var refs []*pb.PageRef
		for i := 0; i < batch && done+i < n; i++ {
			r := &pb.PageRef{Key: make([]byte, 16)}
			rand.Read(r.Key)
			for j := 0; j < per; j++ {
				r.Blocks = append(r.Blocks, uint32(i*per+j))
			}
			refs = append(refs, r)
		}
		st, err := be.E.Save(ctx, refs, pb.Durability_DURABILITY_SSD)
		if err != nil {
			return done, err
		}
		if err := engineclient.AllOK(st); err != nil {
			return done, err
		}
		done += len(refs)
	}
	return n, nil
}

// timeStarts returns the median time from exec to a Status answer of a
// child peer over dir, each start after a clean stop (SIGTERM) or a kill -9
// of the previous one.
func (b *restartBench) timeStarts(ctx context.Context, dir string, ssdBytes uint64, kill bool) (time.Duration, error) {
	cfg := b.config(dir, ssdBytes)
	args := []string{"serve", "--data-dir", dir, "--metrics-addr", "", "--cuda", "off", "--log-level", "warn",
		"--dram-bytes", cfg.DRAMBytes.String(), "--dram-slab-bytes", cfg.DRAMSlabBytes.String(),
		"--ssd-bytes", cfg.SSDBytes.String(), "--ssd-file-bytes", cfg.SSDFileBytes.String(), fmt.Sprintf("--ssd-sparse=%t", cfg.SSDSparse)}
	sock := filepath.Join(dir, "orbitkv.sock")
	var times []time.Duration
	for i := 0; i <= b.reps; i++ { // start 0 only sets up the stop that the first timed start follows
		t0 := time.Now()
		cmd := exec.CommandContext(ctx, b.exe, args...)
		var stderr strings.Builder
		cmd.Stderr = &stderr
		if err := cmd.Start(); err != nil {
			return 0, err
		}
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		err := waitStatus(ctx, sock, exited, 5*time.Minute)
		d := time.Since(t0)
		if err != nil {
			cmd.Process.Kill()
			<-exited
			return 0, fmt.Errorf("%w\n%s", err, stderr.String())
		}
		if i > 0 {
			times = append(times, d)
		}
		sig := syscall.SIGTERM
		if kill {
			sig = syscall.SIGKILL
		}
		cmd.Process.Signal(sig)
		if err := <-exited; err != nil && !kill {
			return 0, fmt.Errorf("clean stop: %w\n%s", err, stderr.String())
		}
	}
	slices.Sort(times)
	return times[len(times)/2], nil
}

// waitStatus polls the peer's socket until a Status call answers.
// exited receives the child's end: then it will never answer.
func waitStatus(ctx context.Context, sock string, exited chan error, limit time.Duration) error {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("peer exited before serving: %v", err)
		case <-ctx.Done():
			return ctx.Err()
		default:
		}
		if statusOnce(ctx, sock) == nil {
			return nil
		}
		time.Sleep(time.Millisecond)
	}
	return errors.New("peer did not answer Status in time")
}

func statusOnce(ctx context.Context, sock string) error {
	c, err := net.DialTimeout("unix", sock, 100*time.Millisecond)
	if err != nil {
		return err
	}
	c.Close()
	conn, err := grpc.NewClient("unix://"+sock, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return err
	}
	defer conn.Close()
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	_, err = pb.NewAdminServiceClient(conn).Status(cctx, &pb.StatusRequest{})
	return err
}
