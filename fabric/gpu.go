package fabric

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/tiers/hbm"
	"github.com/orbitkv/orbitkv/transfer"
)

// gpuState is the peer's CUDA side: the DRAM pool registered with the driver
// (pinned and mapped, so pages move by DMA or by the copy kernel without a
// staging copy), the devices opened for CUDA sessions, one transport per
// device, and the importer of engines' IPC handles. It exists only where the
// driver loaded and at least one GPU is present; without it CUDA sessions
// are refused and everything else works.
type gpuState struct {
	cfg   transfer.CUDAConfig
	host  *cuda.HostRegion
	dev0  *cuda.Device // registered the pool; closed last
	count int
	dramR *transfer.Region
	imp   *hbm.Importer
	mu    struct {
		sync.Mutex
		devs map[int]*gpuDevice
	}
}

type gpuDevice struct {
	d    *cuda.Device
	xfer *transfer.CUDA
}

// openGPU pins the DRAM pool when CUDA is usable. It returns (nil, nil)
// when there is no driver or no GPU and cfg.CUDA is "auto"; an error only
// when cfg.CUDA is "require" or registration itself fails.
func openGPU(cfg Config, dramR *transfer.Region, log zerolog.Logger) (*gpuState, error) {
	if cfg.CUDA == "off" {
		log.Info().Msg("cuda: disabled (--cuda=off); CUDA sessions will be refused")
		return nil, nil
	}
	absent := func(err error) (*gpuState, error) {
		if cfg.CUDA == "require" {
			return nil, fmt.Errorf("cuda required: %w", err)
		}
		log.Info().Err(err).Msg("cuda: not available; serving shared-memory sessions only")
		return nil, nil
	}
	if err := cuda.Init(); err != nil {
		return absent(err)
	}
	n, err := cuda.DeviceCount()
	if err != nil || n == 0 {
		return absent(fmt.Errorf("no CUDA device (count %d): %v", n, err))
	}
	d, err := cuda.Open(0)
	if err != nil {
		return absent(err)
	}
	start := time.Now()
	h, err := d.RegisterHost(dramR.Host)
	if err != nil {
		d.Close()
		return absent(fmt.Errorf("register the dram pool (%d bytes): %w", len(dramR.Host), err))
	}
	g := &gpuState{cfg: transfer.CUDAConfig{Copiers: cfg.CUDACopiers}, host: h, dev0: d, count: n, dramR: dramR, imp: hbm.NewImporter()}
	if cfg.CUDAMethod != "" {
		if g.cfg.Copier.Method, err = cuda.ParseMethod(cfg.CUDAMethod); err != nil {
			return nil, errors.Join(err, g.close())
		}
	}
	g.mu.devs = make(map[int]*gpuDevice)
	log.Info().Int("devices", n).Uint64("pinned_bytes", h.Len()).Dur("register", time.Since(start)).
		Msg("cuda: dram pool pinned and mapped; CUDA sessions enabled")
	return g, nil
}

// device returns the opened device and its transport, opening them on first use.
func (g *gpuState) device(ordinal int) (*gpuDevice, error) {
	if ordinal < 0 || ordinal >= g.count {
		return nil, fmt.Errorf("%w: CUDA device %d, this peer sees %d", errInvalid, ordinal, g.count)
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if gd, ok := g.mu.devs[ordinal]; ok {
		return gd, nil
	}
	d := g.dev0
	if ordinal != 0 {
		var err error
		if d, err = cuda.Open(ordinal); err != nil {
			return nil, fmt.Errorf("%w: open CUDA device %d: %w", hbm.ErrBuffer, ordinal, err)
		}
	}
	x, err := transfer.NewCUDA(d, g.host, g.dramR, g.cfg)
	if err != nil {
		if ordinal != 0 {
			d.Close()
		}
		return nil, fmt.Errorf("%w: cuda transport on device %d: %w", hbm.ErrBuffer, ordinal, err)
	}
	gd := &gpuDevice{d: d, xfer: x}
	g.mu.devs[ordinal] = gd
	return gd, nil
}

// close tears down transports, unpins the pool and closes the devices. Every
// session (and so every IPC mapping) is closed before.
func (g *gpuState) close() error {
	if g == nil {
		return nil
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	var errs []error
	for ord, gd := range g.mu.devs {
		errs = append(errs, gd.xfer.Close())
		if ord != 0 {
			errs = append(errs, gd.d.Close())
		}
	}
	g.mu.devs = nil
	errs = append(errs, g.host.Unregister(), g.dev0.Close())
	return errors.Join(errs...)
}

// CUDAStats returns each opened GPU's transport counters (benchmarks,
// status); nil without CUDA.
func (p *Peer) CUDAStats() map[int]transfer.CUDAStats {
	if p.gpu == nil {
		return nil
	}
	p.gpu.mu.Lock()
	defer p.gpu.mu.Unlock()
	out := make(map[int]transfer.CUDAStats, len(p.gpu.mu.devs))
	for ord, gd := range p.gpu.mu.devs {
		out[ord] = gd.xfer.Stats()
	}
	return out
}

// importCUDA maps a session's CUDA buffers; all of them must live on one
// device. On error nothing stays mapped.
func (p *Peer) importCUDA(s *session, specs []cudaSpec) error {
	if p.gpu == nil {
		return hbm.ErrNoGPU
	}
	dev := specs[0].device
	for i, b := range specs {
		if b.device != dev {
			return fmt.Errorf("%w: buffer %d is on CUDA device %d, buffer 0 on %d: one session, one device", errInvalid, i, b.device, dev)
		}
	}
	gd, err := p.gpu.device(dev)
	if err != nil {
		return err
	}
	for i, b := range specs {
		buf, err := p.gpu.imp.Import(gd.d, b.handle, b.offset, b.size)
		if err != nil {
			s.unmap()
			return fmt.Errorf("buffer %d: %w", i, err)
		}
		s.gpuBufs = append(s.gpuBufs, buf)
		s.bufs = append(s.bufs, &transfer.Region{Name: fmt.Sprintf("cuda%d/buffer%d", dev, i), Kind: transfer.Device,
			Device: uint64(buf.Ptr), Ordinal: dev, Size: buf.Size})
	}
	s.gpu = gd.xfer
	return nil
}

// cudaSpec is a validated CUDA IPC buffer of an OpenSession request.
type cudaSpec struct {
	handle []byte
	device int
	offset uint64
	size   uint64
}

// saveGroupBytes is how many page bytes a save copies before checksumming
// them while the next group copies (the D2H and the CRC overlap).
const saveGroupBytes = 64 << 20

// gpuChunk is how many pages one device batch of a CUDA session's save or
// load moves: a quarter of the DRAM pool's slots (not saveChunk's 16: every
// device batch has a fixed cost, and an 8K-token restore is 128 pages).
func (s *pageStore) gpuChunk(pageBytes uint64) int {
	slots := s.pool.Stats().CapacityBytes / dram.SlotBytes(pageBytes)
	return int(max(1, slots/4))
}

// saveGPU is save for a CUDA session: gather on the device, then the same
// write-through and catalog commit as every save.
func (s *pageStore) saveGPU(ctx context.Context, sess *session, reqs []pageReq, toSSD bool, res []pageResult) {
	items := s.gatherGPU(ctx, sess, reqs, toSSD, res)
	if toSSD && len(items) > 0 {
		items = s.writeThrough(ctx, items, res)
	}
	s.commitSaves(items, res)
}

// gatherGPU copies every page of a save out of the GPU into fresh DRAM slots
// with one batched device copy, and checksums each page on the host from its
// pinned slot once its group has landed (overlapping the next group's copy).
func (s *pageStore) gatherGPU(ctx context.Context, sess *session, reqs []pageReq, toSSD bool, res []pageResult) []*saveItem {
	var items []*saveItem
	for i, r := range reqs {
		if e, ok := s.cat.Get(r.Key); ok && (e.OnSSD || !toSSD) {
			res[i] = okResult(e.Tier())
			continue
		}
		slot, err := s.allocDRAM(ctx, sess.pageBytes)
		if err != nil {
			res[i] = failResult(fmt.Errorf("dram slot: %w", err))
			continue
		}
		items = append(items, &saveItem{i: i, key: r.Key, slot: slot})
	}
	if len(items) == 0 {
		return nil
	}
	s.m.inflight.Inc()
	defer s.m.inflight.Dec()
	per := max(1, int(saveGroupBytes/sess.pageBytes))
	var groups [][]transfer.Desc
	var members [][]*saveItem
	var planned []*saveItem
	for _, it := range items {
		descs, err := sess.geom.Gather(nil, sess.bufs, reqs[it.i].Blocks, s.dramR, s.pool.Offset(it.slot))
		if err != nil {
			res[it.i] = failResult(fmt.Errorf("gather page: %w", err))
			s.freeDRAM(it.slot)
			continue
		}
		if len(members) == 0 || len(members[len(members)-1]) == per {
			groups, members = append(groups, nil), append(members, nil)
		}
		g := len(groups) - 1
		groups[g] = append(groups[g], descs...)
		members[g] = append(members[g], it)
		planned = append(planned, it)
	}
	// Each group's pages are checksummed from their pinned slots once the
	// group has landed, while the next group copies.
	crcs := make([]uint32, len(reqs))
	copied := make([]bool, len(reqs))
	err := sess.gpu.CopyGroups(ctx, groups, func(g int) {
		parallel(len(members[g]), func(j int) {
			it := members[g][j]
			buf := s.pool.Bytes(it.slot)
			if toSSD { // else sealed later, off the engine's path (seal.go)
				crcs[it.i] = crc32.Checksum(buf[:sess.pageBytes], castagnoli)
			}
			clear(buf[sess.pageBytes:]) // O_DIRECT writes the padding too
			copied[it.i] = true
		})
	})
	var out []*saveItem
	for _, it := range planned {
		if !copied[it.i] {
			res[it.i] = failResult(fmt.Errorf("gather page over cuda: %w", errors.Join(err, errors.New("page not copied"))))
			s.freeDRAM(it.slot)
			continue
		}
		it.entry = catalog.Entry{Key: it.key, Layout: sess.fp, Size: sess.pageBytes, Checksum: crcs[it.i],
			Generation: s.nextGen(), DRAMSlot: int64(it.slot), LastAccess: now()}
		it.unsealed = !toSSD
		out = append(out, it)
	}
	return out
}

// scatterGPU copies every pending page of a load from its DRAM slot into the
// engine's GPU blocks with one batched device copy.
func (s *pageStore) scatterGPU(ctx context.Context, sess *session, items []*loadItem, res []pageResult) {
	var descs []transfer.Desc
	var moving []*loadItem
	for _, it := range items {
		if res[it.i].Code != codePending {
			continue
		}
		d, err := sess.geom.Scatter(descs, sess.bufs, it.req.Blocks, s.dramR, s.pool.Offset(it.slot))
		if err != nil {
			res[it.i] = failResult(err)
			continue
		}
		descs = d
		moving = append(moving, it)
	}
	if len(moving) == 0 {
		return
	}
	s.m.inflight.Inc()
	err := sess.gpu.Copy(ctx, descs)
	s.m.inflight.Dec()
	for _, it := range moving {
		if err != nil {
			res[it.i] = failResult(fmt.Errorf("scatter page over cuda: %w", err))
			continue
		}
		s.m.loadedPages.WithLabelValues(it.tier.String()).Inc()
		s.m.loadedTokens.Add(float64(sess.layout.PageTokens))
		res[it.i] = okResult(it.tier)
	}
}
