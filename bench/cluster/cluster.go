// Package cluster is `orbitkv bench cluster`: catalog convergence (DESIGN.md §6 "catalog"). Pages saved
// on the first peer are announced to the others; it measures how long
// until every other peer's remote index holds all of them (and its lookups
// find them), the bytes the peers sent on their network devices meanwhile
// (less the idle cluster's rate, measured first), the others' resident
// memory per remote page, and the in-memory size of one remote-index entry.
// The peers run as separate processes, each in its own network namespace
// (scripts/bench-cluster-netns.sh), so their device counters hold only the
// cluster's traffic.
//
// It reaches the peers through their public surfaces only: the engine API
// on their sockets, /metrics, and /proc for their device counters and RSS.
package cluster

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// benchClusterFlash is a 4 KiB page (one layer, K and V of 16 tokens × 64 bf16).
var benchClusterFlash = engineclient.Flash{Layers: 1, NumBlocks: 64, BlockTokens: 16, PageTokens: 16, KVHeads: 1, HeadDim: 64, ElemBytes: 2}

// Config is a cluster bench's run against peers already started.
type Config struct {
	Sockets []string      // engine sockets of the peers; the first saves the pages
	Metrics []string      // metrics addresses (host:port) of the same peers
	PIDs    []int         // process ids of the same peers (device counters, RSS)
	Pages   int           // pages announced
	Batch   int           // pages per save
	Idle    time.Duration // how long the idle cluster's traffic is measured first
	Timeout time.Duration // give up when the pages are not all visible by then
	ShmDir  string        // where the engine buffer file goes
}

// DefaultConfig is `orbitkv bench cluster`'s default run (the peers left to the caller).
func DefaultConfig() Config {
	return Config{Pages: 100_000, Batch: 512, Idle: 3 * time.Second, Timeout: 5 * time.Minute, ShmDir: "/dev/shm"}
}

// Run validates cfg and measures the peers' convergence.
func Run(ctx context.Context, cfg Config, out io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	return benchCluster(ctx, out, cfg)
}

// Validate checks that cfg names at least two peers, each with its socket,
// metrics address and pid, and a positive page count and batch.
func (c Config) Validate() error {
	n := len(c.Sockets)
	switch {
	case n < 2:
		return errors.New("bench cluster: --sockets needs at least two peers")
	case len(c.Metrics) != n || len(c.PIDs) != n:
		return fmt.Errorf("bench cluster: %d sockets, %d metrics addresses and %d pids: give one of each per peer", n, len(c.Metrics), len(c.PIDs))
	case c.Pages <= 0 || c.Batch <= 0:
		return errors.New("bench cluster: --pages and --batch must be positive")
	}
	return nil
}

// clusterSample is the cluster's state at one instant.
type clusterSample struct {
	at     time.Time
	txSum  uint64   // bytes the peers sent on their devices (loopback excluded)
	rss    []uint64 // per peer
	remote []float64
}

func sampleCluster(c Config) (clusterSample, error) {
	s := clusterSample{at: time.Now()}
	for i, pid := range c.PIDs {
		tx, err := deviceTxBytes(pid)
		if err != nil {
			return s, err
		}
		rss, err := residentBytes(pid)
		if err != nil {
			return s, err
		}
		r, err := scrapeMetric(c.Metrics[i], "orbitkv_cluster_remote_pages")
		if err != nil {
			return s, err
		}
		s.txSum += tx
		s.rss = append(s.rss, rss)
		s.remote = append(s.remote, r)
	}
	return s, nil
}

func benchCluster(ctx context.Context, out io.Writer, c Config) error {
	if err := waitClusterFormed(ctx, c, 30*time.Second); err != nil {
		return err
	}
	before, err := sampleCluster(c)
	if err != nil {
		return err
	}
	select { // the idle cluster's own traffic: probes, heartbeats, push/pull
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(c.Idle):
	}
	idle, err := sampleCluster(c)
	if err != nil {
		return err
	}
	idleRate := float64(idle.txSum-before.txSum) / idle.at.Sub(before.at).Seconds()

	eng, closeEng, err := benchClusterEngine(ctx, c.Sockets[0], c.ShmDir)
	if err != nil {
		return err
	}
	defer closeEng()
	keys := make([][]byte, c.Pages)
	for i := range keys {
		keys[i] = make([]byte, 16)
		rand.Read(keys[i])
	}
	start := idle
	saved, err := benchClusterSave(ctx, eng, keys, c.Batch)
	if err != nil {
		return err
	}
	visible, err := waitVisible(ctx, c, idle, start.at.Add(c.Timeout))
	if err != nil {
		return err
	}
	if err := lookupAll(ctx, c, keys); err != nil {
		return err
	}
	return reportCluster(out, c, start, saved, visible, idleRate)
}

// waitClusterFormed waits until every peer counts every peer a member.
func waitClusterFormed(ctx context.Context, c Config, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		formed := true
		for _, m := range c.Metrics {
			n, err := scrapeMetric(m, "orbitkv_cluster_members")
			formed = formed && err == nil && int(n) == len(c.Metrics)
		}
		if formed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench cluster: the %d peers did not all see each other within %v", len(c.Metrics), d)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// benchClusterEngine opens a session on the socket with a fresh buffer.
func benchClusterEngine(ctx context.Context, socket, dir string) (*engineclient.Engine, func(), error) {
	shm, err := engineclient.CreateShm(filepath.Join(dir, fmt.Sprintf("orbitkv-bench-cluster-%d", os.Getpid())), benchClusterFlash.Size())
	if err != nil {
		return nil, nil, err
	}
	rand.Read(shm.Mem)
	conn, err := engineclient.Dial(socket)
	if err != nil {
		shm.Close()
		return nil, nil, err
	}
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	eng, err := engineclient.Open(octx, conn, benchClusterFlash.OpenRequest("bench-cluster", shm.Path))
	if err != nil {
		conn.Close()
		shm.Close()
		return nil, nil, fmt.Errorf("bench cluster: open a session on %s: %w", socket, err)
	}
	return eng, func() {
		cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		eng.Close(cctx)
		conn.Close()
		shm.Close()
	}, nil
}

// benchClusterSave saves the pages (DRAM) in batches; it returns when the
// last was acknowledged.
func benchClusterSave(ctx context.Context, eng *engineclient.Engine, keys [][]byte, batch int) (time.Time, error) {
	per := benchClusterFlash.PageTokens / benchClusterFlash.BlockTokens
	for at := 0; at < len(keys); at += batch {
		refs := make([]*pb.PageRef, 0, batch)
		for i := at; i < min(at+batch, len(keys)); i++ {
			b := uint32(i % (benchClusterFlash.NumBlocks / per) * per)
			refs = append(refs, &pb.PageRef{Key: keys[i], Blocks: []uint32{b}})
		}
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		st, err := eng.Save(sctx, refs, pb.Durability_DURABILITY_DRAM)
		cancel()
		if err == nil {
			err = engineclient.AllOK(st)
		}
		if err != nil {
			return time.Time{}, fmt.Errorf("bench cluster: save pages %d..%d: %w", at, at+len(refs), err)
		}
	}
	return time.Now(), nil
}

// waitVisible polls the other peers' remote index sizes until each has
// grown by the pages announced.
func waitVisible(ctx context.Context, c Config, base clusterSample, deadline time.Time) (clusterSample, error) {
	for {
		s, err := sampleCluster(c)
		if err != nil {
			return s, err
		}
		done := true
		for i := 1; i < len(c.Sockets); i++ {
			done = done && s.remote[i]-base.remote[i] >= float64(c.Pages)
		}
		if done {
			return s, nil
		}
		if s.at.After(deadline) {
			return s, fmt.Errorf("bench cluster: after %v the peers' remote indexes grew by %v of %d pages", c.Timeout, s.remote[1:], c.Pages)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lookupAll checks that every other peer's lookups find every page.
func lookupAll(ctx context.Context, c Config, keys [][]byte) error {
	for _, sock := range c.Sockets[1:] {
		eng, closeEng, err := benchClusterEngine(ctx, sock, c.ShmDir)
		if err != nil {
			return err
		}
		for at := 0; at < len(keys); at += 128 {
			chain := keys[at:min(at+128, len(keys))]
			lctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			look, err := eng.Lookup(lctx, chain, false)
			cancel()
			if err == nil && int(look.HitPages) != len(chain) {
				err = fmt.Errorf("found %d of %d pages", look.HitPages, len(chain))
			}
			if err != nil {
				closeEng()
				return fmt.Errorf("bench cluster: lookup on %s: %w", sock, err)
			}
		}
		closeEng()
	}
	return nil
}

func reportCluster(out io.Writer, c Config, start clusterSample, saved time.Time, end clusterSample, idleRate float64) error {
	took := end.at.Sub(start.at)
	wire := float64(end.txSum - start.txSum)
	announce := max(0, wire-idleRate*took.Seconds())
	perEntry, err := remoteEntryBytes(c.Pages)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d pages saved on peer 1 of %d in %v; visible in every other peer's remote index %v after the first save (%v after the last was acknowledged); every lookup found them\n",
		c.Pages, len(c.Sockets), saved.Sub(start.at).Round(time.Millisecond), took.Round(time.Millisecond), end.at.Sub(saved).Round(time.Millisecond))
	fmt.Fprintf(out, "bytes the peers sent meanwhile: %.1f MB (%.0f B/s idle cluster baseline); for the announcements: %.1f MB, %.1f B per page per receiving peer, %.2f MB/s\n",
		wire/1e6, idleRate, announce/1e6, announce/float64(c.Pages)/float64(len(c.Sockets)-1), announce/1e6/took.Seconds())
	for i := 1; i < len(c.Sockets); i++ {
		d := float64(end.rss[i]) - float64(start.rss[i])
		fmt.Fprintf(out, "peer %d: resident memory +%.1f MB, %.0f B per remote page\n", i+1, d/1e6, d/float64(c.Pages))
	}
	fmt.Fprintf(out, "remote index entry (catalog.Remote, in this process): %.0f B per page\n", perEntry)
	return nil
}

// remoteEntryBytes is the heap one page takes in a remote index of n pages.
func remoteEntryBytes(n int) (float64, error) {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.GC() // what the bench freed before is gone from both readings
	runtime.ReadMemStats(&a)
	r := catalog.NewRemote()
	var fp pagekey.Fingerprint
	for i := range n {
		var k pagekey.Key
		rand.Read(k[:])
		if err := r.Add(i%3, k, fp, 4096); err != nil {
			return 0, err
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&b)
	runtime.KeepAlive(r)
	return (float64(b.HeapAlloc) - float64(a.HeapAlloc)) / float64(n), nil
}

// deviceTxBytes sums the bytes sent on the devices of process pid's network
// namespace, loopback excluded.
func deviceTxBytes(pid int) (uint64, error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/net/dev", pid))
	if err != nil {
		return 0, fmt.Errorf("bench cluster: device counters: %w", err)
	}
	defer f.Close()
	var sum uint64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		dev, rest, ok := strings.Cut(sc.Text(), ":")
		if !ok || strings.TrimSpace(dev) == "lo" {
			continue
		}
		f := strings.Fields(rest)
		if len(f) < 9 {
			continue
		}
		tx, err := strconv.ParseUint(f[8], 10, 64) // receive: 8 fields, then transmit bytes
		if err != nil {
			return 0, fmt.Errorf("bench cluster: /proc/%d/net/dev: %w", pid, err)
		}
		sum += tx
	}
	return sum, sc.Err()
}

// residentBytes is process pid's VmRSS.
func residentBytes(pid int) (uint64, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, fmt.Errorf("bench cluster: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			kb, err := strconv.ParseUint(f[0], 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("bench cluster: no VmRSS for process %d", pid)
}

// scrapeMetric reads one unlabelled sample from a peer's metrics.
func scrapeMetric(addr, name string) (float64, error) {
	m, err := benchutil.ScrapeAll(addr)
	if err != nil {
		return 0, fmt.Errorf("bench cluster: %w", err)
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("bench cluster: %s does not export %s (is it clustered?)", addr, name)
	}
	return v, nil
}
