package transfer

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/rdma"
)

// The rdma rows of bench transfer. Both ends run in the client's process,
// as two engines on the allowed NICs, connected through the NIC (loopback):
// the cross-host exchange of connection data rides the peer gRPC service,
// which the bench does not start. Never run on hardware yet (docs/rdma.md).

// rdmaSkipReason is why the rdma rows cannot run here ("" if they can).
func (b *transferBench) rdmaSkipReason() string {
	err := b.rdmaOpenError()
	if err == nil {
		return ""
	}
	why := err.Error()
	if devs := rdma.SysfsDevices(); len(devs) > 0 {
		why += fmt.Sprintf(" (sysfs lists %s)", strings.Join(devs, ", "))
	}
	return why
}

// rdmaOpenError is rdma.Open's error with the bench's config, nil if an
// engine opens (it is closed again).
func (b *transferBench) rdmaOpenError() error {
	e, err := rdma.Open(b.RDMA)
	if err != nil {
		return err
	}
	e.Close()
	return nil
}

// rdmaSide is one engine and an mmapped region of n pages of size.
type rdmaSide struct {
	e   *rdma.Engine
	mem []byte
	reg *rdma.Region
}

func openRDMASide(cfg rdma.Config, bytes uint64, access rdma.Access) (*rdmaSide, error) {
	e, err := rdma.Open(cfg)
	if err != nil {
		return nil, err
	}
	mem, err := unix.Mmap(-1, 0, int(bytes), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE|unix.MAP_POPULATE)
	if err != nil {
		e.Close()
		return nil, fmt.Errorf("map %d bytes: %w", bytes, err)
	}
	s := &rdmaSide{e: e, mem: mem}
	if s.reg, err = e.RegisterHost("bench", mem, access); err != nil {
		s.close()
		return nil, err
	}
	return s, nil
}

func (s *rdmaSide) close() {
	s.e.Close()
	unix.Munmap(s.mem)
}

// measureRDMA runs one rdma cell: c.conns connections from engine A to
// engine B, READ from B's pages into A's slots or WRITE from A's pages into
// B's slots, each moved page's checksum compared with the one computed
// from its contents.
func (b *transferBench) measureRDMA(ctx context.Context, c *cell) error {
	n, per := b.pagesPer(c.size), b.batchOf(c.size)
	// READ: A (dst) reads B (src), which offers remote READ; WRITE: A
	// (src) writes into B (dst), which offers remote WRITE.
	srcAccess, dstAccess := rdma.RemoteRead, rdma.LocalOnly
	if c.op == "write" {
		srcAccess, dstAccess = rdma.LocalOnly, rdma.RemoteWrite
	}
	src, err := openRDMASide(b.RDMA, uint64(n)*c.size, srcAccess)
	if err != nil {
		return err
	}
	defer src.close()
	dst, err := openRDMASide(b.RDMA, uint64(c.conns*per)*c.size, dstAccess)
	if err != nil {
		return err
	}
	defer dst.close()
	sums := fillSource(src, c.size, n)
	local, remote := dst, src // READ: A (dst) reads B (src)
	if c.op == "write" {
		local, remote = src, dst // WRITE: A (src) writes into B (dst)
	}
	conns, err := dialLoopback(ctx, local.e, remote.e, c.conns)
	if err != nil {
		return err
	}
	var rates []float64
	for r := range b.Rounds + 1 {
		rate, pages, err := b.rdmaRound(ctx, c, conns, dst, sums, local.reg, remote.reg)
		if err != nil {
			return err
		}
		if r > 0 {
			rates = append(rates, rate)
			c.pages += pages
		}
	}
	c.gbps = benchutil.Median(rates)
	return nil
}

// fillSource writes the n source pages and returns their checksums,
// computed from the contents before anything moves.
func fillSource(src *rdmaSide, size uint64, n int) []uint32 {
	sums := make([]uint32, n)
	for i := range n {
		pg := src.mem[uint64(i)*size : uint64(i+1)*size]
		fillPage(pg, size, i)
		sums[i] = page.Checksum(pg)
	}
	return sums
}

// dialLoopback opens n connections from local to remote, the connection
// data handed across in process (the peer gRPC service's job between
// hosts).
func dialLoopback(ctx context.Context, local, remote *rdma.Engine, n int) ([]*rdma.Conn, error) {
	exchange := func(_ context.Context, info rdma.ConnInfo) (rdma.ConnInfo, error) {
		reply, _, err := remote.Accept(info)
		return reply, err
	}
	conns := make([]*rdma.Conn, n)
	for i := range conns {
		var err error
		if conns[i], err = local.Dial(ctx, exchange); err != nil {
			return nil, err
		}
	}
	return conns, nil
}

func (b *transferBench) rdmaRound(ctx context.Context, c *cell, conns []*rdma.Conn, dst *rdmaSide, sums []uint32, local, remote *rdma.Region) (float64, int64, error) {
	d := time.Duration(b.Seconds * float64(time.Second))
	n, per := b.pagesPer(c.size), b.batchOf(c.size)
	var moved atomic.Int64
	var errMu sync.Mutex
	var firstErr error
	start := time.Now()
	var wg sync.WaitGroup
	for s, conn := range conns {
		wg.Go(func() {
			for i := s * per; time.Since(start) < d; i += len(conns) * per {
				ops, pages := rdmaOps(c, i, n, per, s, local, remote)
				bctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				var errs []error
				if c.op == "read" {
					errs = conn.Read(bctx, ops)
				} else {
					errs = conn.Write(bctx, ops)
				}
				cancel()
				err := errors.Join(errs...)
				if err == nil {
					err = verifySlots(c, dst, s*per, pages, sums)
				}
				if err != nil {
					errMu.Lock()
					firstErr = cmpOr(firstErr, err)
					errMu.Unlock()
					return
				}
				moved.Add(int64(len(ops)) * int64(c.size))
			}
		})
	}
	wg.Wait()
	if firstErr != nil {
		return 0, 0, firstErr
	}
	return benchutil.Gbps(uint64(moved.Load()), time.Since(start)), moved.Load() / int64(c.size), nil
}

// rdmaOps are stream s's ops for pages i … i+per (mod n): READ pages from
// the remote source into slots s*per…, WRITE pages from the local source
// into the remote slots s*per….
func rdmaOps(c *cell, i, n, per, s int, local, remote *rdma.Region) ([]rdma.Op, []int) {
	ops := make([]rdma.Op, per)
	pages := make([]int, per)
	for j := range ops {
		pg, slot := uint64((i+j)%n), uint64(s*per+j)
		pages[j] = int(pg)
		if c.op == "read" {
			ops[j] = rdma.Op{Remote: remote.Key, RemoteOff: pg * c.size, Local: []rdma.Segment{{Region: local, Off: slot * c.size, Len: c.size}}}
		} else {
			ops[j] = rdma.Op{Remote: remote.Key, RemoteOff: slot * c.size, Local: []rdma.Segment{{Region: local, Off: pg * c.size, Len: c.size}}}
		}
	}
	return ops, pages
}

// verifySlots checks the destination slots from first against the
// checksums of the pages that were moved into them.
func verifySlots(c *cell, dst *rdmaSide, first int, pages []int, sums []uint32) error {
	for j, pg := range pages {
		slot := uint64(first + j)
		if page.Checksum(dst.mem[slot*c.size:(slot+1)*c.size]) != sums[pg] {
			return fmt.Errorf("page %d in slot %d: bytes differ from the source", pg, slot)
		}
	}
	return nil
}

func cmpOr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}
