// Package ssd is `orbitkv bench ssd`: the SSD tier (tiers/ssd) beside fio
// on the same file, block size, queue depth and bytes. It measures through
// the tier's public Store API (Write and Read with page headers) only.
package ssd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// benchRounds is how many times each phase runs; the table shows medians.
const benchRounds = 5

// Config is an SSD bench's run.
type Config struct {
	Dir       string // directory for the scratch file, on the SSD to test (not tmpfs)
	PageBytes uint64 // page data bytes
	Pages     int    // pages written then read per round
	Depth     int    // pages in flight (fio iodepth)
}

// DefaultConfig is `orbitkv bench ssd`'s default run (Dir left to the caller).
func DefaultConfig() Config { return Config{PageBytes: 2 << 20, Pages: 512, Depth: 32} }

// Run measures the SSD tier against fio on the same file, block size
// (the slot: header block + page), queue depth and bytes: pages pages of
// pageBytes written through Store.Write and read back (verified) through
// Store.Read, in batches of depth, then fio rw=write and rw=read with
// ioengine=io_uring, direct=1. Both sides use O_DIRECT, so nothing is
// served from the page cache. The file is filled once first so that
// neither side pays for converting unwritten extents.
func Run(ctx context.Context, cfg Config, w io.Writer) error {
	dir, pageBytes, pages, depth := cfg.Dir, cfg.PageBytes, cfg.Pages, cfg.Depth
	slot := ssd.SlotBytes(pageBytes)
	capacity := benchCapacity(slot, pages)
	storeCfg := ssd.Config{Dir: dir, CapacityBytes: capacity, FileBytes: capacity, QueueDepth: depth, Sync: ssd.SyncNone}
	file := filepath.Join(dir, ssd.FileName(0))
	total := slot * uint64(pages)
	fmt.Fprintf(w, "ssd bench: %s, %d pages of %d bytes (slot %d bytes), depth %d, %d bytes per phase, median of %d\n",
		file, pages, pageBytes, slot, depth, total, benchRounds)
	if fs := benchutil.MemoryFS(dir); fs != "" {
		fmt.Fprintf(w, "WARNING: %s is on %s: these numbers measure memory, not a disk (give --dir a directory on the SSD)\n", dir, fs)
	}
	s, err := ssd.Open(storeCfg)
	if err != nil {
		return err
	}
	if err := benchutil.RunFio(ctx, file, "write", 1<<20, 4, capacity); err != nil { // fill, untimed
		s.Close()
		return err
	}
	var ours, theirs [2][]float64 // [write, read] GB/s per round
	for range benchRounds {
		wr, rd, err := benchStore(ctx, s, pageBytes, pages, depth)
		if err != nil {
			s.Close()
			return err
		}
		ours[0], ours[1] = append(ours[0], benchutil.Gbps(total, wr)), append(ours[1], benchutil.Gbps(total, rd))
		for i, rw := range []string{"write", "read"} {
			bw, err := benchutil.FioBandwidth(ctx, file, rw, slot, depth, total)
			if err != nil {
				s.Close()
				return err
			}
			theirs[i] = append(theirs[i], bw/1e9)
		}
	}
	if err := s.Close(); err != nil {
		return err
	}
	printSSDTable(w, ours, theirs)
	return nil
}

// benchCapacity is enough whole regions for pages slots of slot bytes.
func benchCapacity(slot uint64, pages int) uint64 {
	if slot > ssd.RegionBytes {
		k := (slot + ssd.RegionBytes - 1) / ssd.RegionBytes
		return uint64(pages) * k * ssd.RegionBytes
	}
	perRegion := ssd.RegionBytes / slot
	return (uint64(pages) + perRegion - 1) / perRegion * ssd.RegionBytes
}

func printSSDTable(w io.Writer, ours, theirs [2][]float64) {
	fmt.Fprintf(w, "%-6s %14s %10s %7s   %s\n", "phase", "OrbitKV GB/s", "fio GB/s", "ratio", "rounds OrbitKV / fio")
	for i, phase := range []string{"write", "read"} {
		o, f := benchutil.Median(ours[i]), benchutil.Median(theirs[i])
		fmt.Fprintf(w, "%-6s %14.2f %10.2f %6.0f%%   %.2f / %.2f\n", phase, o, f, 100*o/f, ours[i], theirs[i])
	}
}

// benchStore writes then reads every page through the Store and returns
// the time of each phase. Slots are freed before it returns.
func benchStore(ctx context.Context, s *ssd.Store, pageBytes uint64, pages, depth int) (wr, rd time.Duration, err error) {
	locs := make([]ssd.Loc, pages)
	for i := range locs {
		if locs[i], err = s.Alloc(pageBytes); err != nil {
			return 0, 0, err
		}
	}
	defer func() {
		for _, l := range locs {
			s.Free(l)
		}
	}()
	bufs, err := newBenchBuffers(pageBytes, depth)
	if err != nil {
		return 0, 0, err
	}
	defer bufs.release()
	wr, err = timeBatches(pages, depth, func(_, lo, hi int) error { return writeBatch(ctx, s, bufs, locs, lo, hi) })
	if err != nil {
		return 0, 0, err
	}
	rd, err = timeBatches(pages, depth, func(st, lo, hi int) error { return readBatch(ctx, s, bufs, st, locs, lo, hi) })
	return wr, rd, err
}

// benchStreams is how many callers issue batches at once. The Store keeps
// at most depth operations in flight over all of them, as fio does; a
// second caller only fills the gap while one waits for its batch's last
// completion.
const benchStreams = 2

// timeBatches runs batch over [0, pages) in chunks of depth from
// benchStreams goroutines and returns the elapsed time.
func timeBatches(pages, depth int, batch func(stream, lo, hi int) error) (time.Duration, error) {
	var next atomic.Int64
	errs := make([]error, benchStreams)
	var wg sync.WaitGroup
	start := time.Now()
	for st := range benchStreams {
		wg.Go(func() {
			for {
				lo := int(next.Add(int64(depth))) - depth
				if lo >= pages || errs[st] != nil {
					return
				}
				errs[st] = batch(st, lo, min(lo+depth, pages))
			}
		})
	}
	wg.Wait()
	return time.Since(start), errors.Join(errs...)
}

func writeBatch(ctx context.Context, s *ssd.Store, b *benchBuffers, locs []ssd.Loc, lo, hi int) error {
	reqs := make([]ssd.WriteReq, 0, hi-lo)
	for i := lo; i < hi; i++ {
		reqs = append(reqs, ssd.WriteReq{Loc: locs[i], Header: b.header(i), Data: b.src[i%len(b.src)]})
	}
	return benchutil.FirstErr(s.Write(ctx, reqs))
}

func readBatch(ctx context.Context, s *ssd.Store, b *benchBuffers, stream int, locs []ssd.Loc, lo, hi int) error {
	reqs := make([]ssd.ReadReq, 0, hi-lo)
	dst := b.dst[stream*len(b.src):]
	for i := lo; i < hi; i++ {
		reqs = append(reqs, ssd.ReadReq{Loc: locs[i], Want: b.header(i), Dst: dst[i-lo]})
	}
	return benchutil.FirstErr(s.Read(ctx, reqs))
}

// benchBuffers holds depth source pages (random bytes, checksummed; page i
// is src[i % depth]) and depth destination pages per stream, page-aligned
// and pre-faulted, off the Go heap.
type benchBuffers struct {
	mem      []byte
	src, dst [][]byte
	sums     []uint32
	length   uint64
}

func newBenchBuffers(pageBytes uint64, depth int) (*benchBuffers, error) {
	n := page.AlignUp(pageBytes)
	count := (1 + benchStreams) * depth
	// Buffers like the DRAM pool's (tiers/dram): huge pages advised before
	// the memory is faulted in, so each I/O pins few pages.
	mem, err := unix.Mmap(-1, 0, int(n)*count, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		return nil, fmt.Errorf("map %d bench buffers: %w", count, err)
	}
	_ = unix.Madvise(mem, unix.MADV_HUGEPAGE)
	if err := unix.Madvise(mem, unix.MADV_POPULATE_WRITE); err != nil {
		clear(mem)
	}
	b := &benchBuffers{mem: mem, length: pageBytes}
	seed := uint64(time.Now().UnixNano())
	for i := range count {
		buf := mem[uint64(i)*n : uint64(i+1)*n : uint64(i+1)*n]
		if i >= depth {
			b.dst = append(b.dst, buf)
			continue
		}
		for j := 0; j+8 <= int(pageBytes); j += 8 {
			seed = seed*6364136223846793005 + 1442695040888963407
			buf[j], buf[j+3], buf[j+7] = byte(seed>>56), byte(seed>>40), byte(seed>>24)
		}
		b.src, b.sums = append(b.src, buf), append(b.sums, page.Checksum(buf[:pageBytes]))
	}
	return b, nil
}

// header describes page i.
func (b *benchBuffers) header(i int) page.Header {
	h := page.Header{Length: b.length, Checksum: b.sums[i%len(b.src)], Generation: uint64(i + 1)}
	h.Key[0], h.Key[1], h.Key[2] = 0xbe, byte(i), byte(i>>8)
	return h
}

func (b *benchBuffers) release() { _ = unix.Munmap(b.mem) }
