package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// benchRounds is how many times each phase runs; the table shows medians.
const benchRounds = 5

// benchSSD measures the SSD tier against fio on the same file, block size
// (the slot: header block + page), queue depth and bytes: pages pages of
// pageBytes written through Store.Write and read back (verified) through
// Store.Read, in batches of depth, then fio rw=write and rw=read with
// ioengine=io_uring, direct=1. Both sides use O_DIRECT, so nothing is
// served from the page cache. The file is filled once first so that
// neither side pays for converting unwritten extents.
func benchSSD(ctx context.Context, w io.Writer, dir string, pageBytes uint64, pages int, depth int) error {
	slot := ssd.SlotBytes(pageBytes)
	capacity := benchCapacity(slot, pages)
	cfg := ssd.Config{Dir: dir, CapacityBytes: capacity, FileBytes: capacity, QueueDepth: depth, Sync: ssd.SyncNone}
	file := filepath.Join(dir, ssd.FileName(0))
	total := slot * uint64(pages)
	fmt.Fprintf(w, "ssd bench: %s, %d pages of %d bytes (slot %d bytes), depth %d, %d bytes per phase, median of %d\n",
		file, pages, pageBytes, slot, depth, total, benchRounds)
	if fs := memoryFS(dir); fs != "" {
		fmt.Fprintf(w, "WARNING: %s is on %s: these numbers measure memory, not a disk (give --dir a directory on the SSD)\n", dir, fs)
	}
	s, err := ssd.Open(cfg)
	if err != nil {
		return err
	}
	if err := runFio(ctx, file, "write", 1<<20, 4, capacity); err != nil { // fill, untimed
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
		ours[0], ours[1] = append(ours[0], gbps(total, wr)), append(ours[1], gbps(total, rd))
		for i, rw := range []string{"write", "read"} {
			bw, err := fioBandwidth(ctx, file, rw, slot, depth, total)
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

// memoryFS names the memory-backed file system dir is (or will be) on:
// tmpfs or ramfs, by the statfs magic of dir or of its nearest existing
// ancestor; "" for any other (or when statfs fails: the benchmark's own
// open will say why).
func memoryFS(dir string) string {
	var st unix.Statfs_t
	for d := filepath.Clean(dir); ; d = filepath.Dir(d) {
		err := unix.Statfs(d, &st)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.ENOENT) || d == filepath.Dir(d) {
			return ""
		}
	}
	switch uint32(st.Type) {
	case unix.TMPFS_MAGIC:
		return "tmpfs"
	case unix.RAMFS_MAGIC:
		return "ramfs"
	}
	return ""
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
		o, f := median(ours[i]), median(theirs[i])
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
	return firstErr(s.Write(ctx, reqs))
}

func readBatch(ctx context.Context, s *ssd.Store, b *benchBuffers, stream int, locs []ssd.Loc, lo, hi int) error {
	reqs := make([]ssd.ReadReq, 0, hi-lo)
	dst := b.dst[stream*len(b.src):]
	for i := lo; i < hi; i++ {
		reqs = append(reqs, ssd.ReadReq{Loc: locs[i], Want: b.header(i), Dst: dst[i-lo]})
	}
	return firstErr(s.Read(ctx, reqs))
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

func firstErr(errs []error) error {
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}

func gbps(bytes uint64, d time.Duration) float64 { return float64(bytes) / d.Seconds() / 1e9 }

func median(xs []float64) float64 {
	s := slices.Clone(xs)
	slices.Sort(s)
	return s[len(s)/2]
}

// fioBandwidth runs one fio job and returns its bandwidth in bytes/s.
func fioBandwidth(ctx context.Context, file, rw string, bs uint64, depth int, size uint64) (float64, error) {
	out, err := fio(ctx, file, rw, bs, depth, size)
	if err != nil {
		return 0, err
	}
	var res struct {
		Jobs []struct {
			Read struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"read"`
			Write struct {
				BwBytes float64 `json:"bw_bytes"`
			} `json:"write"`
		} `json:"jobs"`
	}
	if i := bytes.IndexByte(out, '{'); i > 0 {
		out = out[i:] // fio may print notes before the JSON
	}
	if err := json.Unmarshal(out, &res); err != nil || len(res.Jobs) != 1 {
		return 0, fmt.Errorf("parse fio %s output: %v (%d jobs)", rw, err, len(res.Jobs))
	}
	if rw == "read" {
		return res.Jobs[0].Read.BwBytes, nil
	}
	return res.Jobs[0].Write.BwBytes, nil
}

func runFio(ctx context.Context, file, rw string, bs uint64, depth int, size uint64) error {
	_, err := fio(ctx, file, rw, bs, depth, size)
	return err
}

func fio(ctx context.Context, file, rw string, bs uint64, depth int, size uint64) ([]byte, error) {
	cmd := exec.CommandContext(ctx, "fio", "--name=orbitkv-ssd", "--filename="+file, "--rw="+rw,
		fmt.Sprintf("--bs=%d", bs), fmt.Sprintf("--iodepth=%d", depth), "--ioengine=io_uring",
		"--direct=1", fmt.Sprintf("--size=%d", size), "--output-format=json",
		// fio at its best for this block size and depth: registered buffers
		// and file, whole-depth batches (measured: 1.3 GB/s plain, 3.2 with
		// these on the same read), so the ratio is not flattered.
		"--fixedbufs", "--registerfiles", fmt.Sprintf("--iodepth_batch_submit=%d", depth),
		fmt.Sprintf("--iodepth_batch_complete_max=%d", depth))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("fio %s on %s: %w: %s", rw, file, err, stderr.Bytes())
	}
	return out, nil
}
