package main

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// bench cluster: catalog convergence (DESIGN.md §6 "catalog"). Pages saved
// on the first peer are announced to the others; it measures how long
// until every other peer's remote index holds all of them (and its lookups
// find them), the bytes the peers sent on their network devices meanwhile
// (less the idle cluster's rate, measured first), the others' resident
// memory per remote page, and the in-memory size of one remote-index entry.
// The peers run as separate processes, each in its own network namespace
// (scripts/bench-cluster-netns.sh), so their device counters hold only the
// cluster's traffic.

// benchClusterFlash is a 4 KiB page (one layer, K and V of 16 tokens × 64 bf16).
var benchClusterFlash = engineclient.Flash{Layers: 1, NumBlocks: 64, BlockTokens: 16, PageTokens: 16, KVHeads: 1, HeadDim: 64, ElemBytes: 2}

type benchClusterConfig struct {
	sockets, metrics []string
	pids             []int
	pages, batch     int
	idle, timeout    time.Duration
	shmDir           string
}

func runBenchCluster(ctx context.Context, args []string, out io.Writer) error {
	fs := flag.NewFlagSet("bench cluster", flag.ContinueOnError)
	sockets := fs.String("sockets", "", "engine sockets of the peers, comma-separated; the first saves the pages")
	metrics := fs.String("metrics", "", "metrics addresses (host:port) of the same peers, comma-separated")
	pids := fs.String("pids", "", "process ids of the same peers, comma-separated (device counters from /proc/PID/net/dev, RSS)")
	var cfg benchClusterConfig
	fs.IntVar(&cfg.pages, "pages", 100_000, "pages announced")
	fs.IntVar(&cfg.batch, "batch", 512, "pages per save")
	fs.DurationVar(&cfg.idle, "idle", 3*time.Second, "how long the idle cluster's traffic is measured first")
	fs.DurationVar(&cfg.timeout, "timeout", 5*time.Minute, "give up when the pages are not all visible by then")
	fs.StringVar(&cfg.shmDir, "shm-dir", "/dev/shm", "where the engine buffer file goes")
	if err := fs.Parse(args); err != nil {
		return err
	}
	cfg.sockets, cfg.metrics = splitList(*sockets), splitList(*metrics)
	for _, p := range splitList(*pids) {
		n, err := strconv.Atoi(p)
		if err != nil {
			return fmt.Errorf("bench cluster: --pids: %q is not a process id", p)
		}
		cfg.pids = append(cfg.pids, n)
	}
	if err := cfg.validate(); err != nil {
		return err
	}
	return benchCluster(ctx, out, cfg)
}

func (c benchClusterConfig) validate() error {
	n := len(c.sockets)
	switch {
	case n < 2:
		return errors.New("bench cluster: --sockets needs at least two peers")
	case len(c.metrics) != n || len(c.pids) != n:
		return fmt.Errorf("bench cluster: %d sockets, %d metrics addresses and %d pids: give one of each per peer", n, len(c.metrics), len(c.pids))
	case c.pages <= 0 || c.batch <= 0:
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

func sampleCluster(c benchClusterConfig) (clusterSample, error) {
	s := clusterSample{at: time.Now()}
	for i, pid := range c.pids {
		tx, err := deviceTxBytes(pid)
		if err != nil {
			return s, err
		}
		rss, err := residentBytes(pid)
		if err != nil {
			return s, err
		}
		r, err := scrapeMetric(c.metrics[i], "orbitkv_cluster_remote_pages")
		if err != nil {
			return s, err
		}
		s.txSum += tx
		s.rss = append(s.rss, rss)
		s.remote = append(s.remote, r)
	}
	return s, nil
}

func benchCluster(ctx context.Context, out io.Writer, c benchClusterConfig) error {
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
	case <-time.After(c.idle):
	}
	idle, err := sampleCluster(c)
	if err != nil {
		return err
	}
	idleRate := float64(idle.txSum-before.txSum) / idle.at.Sub(before.at).Seconds()

	eng, closeEng, err := benchClusterEngine(ctx, c.sockets[0], c.shmDir)
	if err != nil {
		return err
	}
	defer closeEng()
	keys := make([][]byte, c.pages)
	for i := range keys {
		keys[i] = make([]byte, 16)
		rand.Read(keys[i])
	}
	start := idle
	saved, err := benchClusterSave(ctx, eng, keys, c.batch)
	if err != nil {
		return err
	}
	visible, err := waitVisible(ctx, c, idle, start.at.Add(c.timeout))
	if err != nil {
		return err
	}
	if err := lookupAll(ctx, c, keys); err != nil {
		return err
	}
	return reportCluster(out, c, start, saved, visible, idleRate)
}

// waitClusterFormed waits until every peer counts every peer a member.
func waitClusterFormed(ctx context.Context, c benchClusterConfig, d time.Duration) error {
	deadline := time.Now().Add(d)
	for {
		formed := true
		for _, m := range c.metrics {
			n, err := scrapeMetric(m, "orbitkv_cluster_members")
			formed = formed && err == nil && int(n) == len(c.metrics)
		}
		if formed {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("bench cluster: the %d peers did not all see each other within %v", len(c.metrics), d)
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
func waitVisible(ctx context.Context, c benchClusterConfig, base clusterSample, deadline time.Time) (clusterSample, error) {
	for {
		s, err := sampleCluster(c)
		if err != nil {
			return s, err
		}
		done := true
		for i := 1; i < len(c.sockets); i++ {
			done = done && s.remote[i]-base.remote[i] >= float64(c.pages)
		}
		if done {
			return s, nil
		}
		if s.at.After(deadline) {
			return s, fmt.Errorf("bench cluster: after %v the peers' remote indexes grew by %v of %d pages", c.timeout, s.remote[1:], c.pages)
		}
		select {
		case <-ctx.Done():
			return s, ctx.Err()
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// lookupAll checks that every other peer's lookups find every page.
func lookupAll(ctx context.Context, c benchClusterConfig, keys [][]byte) error {
	for _, sock := range c.sockets[1:] {
		eng, closeEng, err := benchClusterEngine(ctx, sock, c.shmDir)
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

func reportCluster(out io.Writer, c benchClusterConfig, start clusterSample, saved time.Time, end clusterSample, idleRate float64) error {
	took := end.at.Sub(start.at)
	wire := float64(end.txSum - start.txSum)
	announce := max(0, wire-idleRate*took.Seconds())
	perEntry, err := remoteEntryBytes(c.pages)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "%d pages saved on peer 1 of %d in %v; visible in every other peer's remote index %v after the first save (%v after the last was acknowledged); every lookup found them\n",
		c.pages, len(c.sockets), saved.Sub(start.at).Round(time.Millisecond), took.Round(time.Millisecond), end.at.Sub(saved).Round(time.Millisecond))
	fmt.Fprintf(out, "bytes the peers sent meanwhile: %.1f MB (%.0f B/s idle cluster baseline); for the announcements: %.1f MB, %.1f B per page per receiving peer, %.2f MB/s\n",
		wire/1e6, idleRate, announce/1e6, announce/float64(c.pages)/float64(len(c.sockets)-1), announce/1e6/took.Seconds())
	for i := 1; i < len(c.sockets); i++ {
		d := float64(end.rss[i]) - float64(start.rss[i])
		fmt.Fprintf(out, "peer %d: resident memory +%.1f MB, %.0f B per remote page\n", i+1, d/1e6, d/float64(c.pages))
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
	m, err := scrapeAll(addr)
	if err != nil {
		return 0, fmt.Errorf("bench cluster: %w", err)
	}
	v, ok := m[name]
	if !ok {
		return 0, fmt.Errorf("bench cluster: %s does not export %s (is it clustered?)", addr, name)
	}
	return v, nil
}
