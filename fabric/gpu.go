package fabric

import (
	"errors"
	"fmt"
	"github.com/orbitkv/orbitkv/fabric/engineapi"
	"github.com/orbitkv/orbitkv/fabric/store"
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/rdma"
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
	// stageBytes is --hbm-stage-bytes; addStage makes a new stage a source
	// for every CUDA load (store.AddHBMStage).
	stageBytes uint64
	addStage   func(*store.HBMStage)
	log        zerolog.Logger
	mu         struct {
		sync.Mutex
		devs map[int]*gpuDevice
	}

	// verbs registers sessions' buffers for GPUDirect (the cluster; nil on
	// a standalone peer). Set once, before the engine API serves.
	verbs hbmRegistrar
}

type gpuDevice struct {
	d     *cuda.Device
	xfer  *transfer.CUDA
	stage *store.HBMStage // nil: --hbm-stage-bytes 0, or its allocation failed
	mem   *cuda.DeviceMem // the stage's HBM
}

// openGPU pins the DRAM pool when CUDA is usable. It returns (nil, nil)
// when there is no driver or no GPU and cfg.CUDA is "auto"; an error only
// when cfg.CUDA is "require" or registration itself fails.
func openGPU(cfg Config, dramR *transfer.Region, addStage func(*store.HBMStage), log zerolog.Logger) (*gpuState, error) {
	if cfg.CUDA == "off" {
		log.Info().Msg("cuda: disabled (--cuda=off); CUDA sessions will be refused")
		return nil, nil
	}
	absent := func(err error) (*gpuState, error) {
		if cfg.CUDA == "require" {
			return nil, fmt.Errorf("cuda required: %w", err)
		}
		log.Info().Str("reason", err.Error()).Msg("cuda: not available; serving shared-memory sessions only")
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
	g := &gpuState{cfg: transfer.CUDAConfig{Copiers: cfg.CUDACopiers, NoLayerGates: !cfg.CUDALayerGates}, host: h, dev0: d, count: n, dramR: dramR, imp: hbm.NewImporter(),
		stageBytes: uint64(cfg.HBMStageBytes), addStage: addStage, log: log}
	g.cfg.Copier.RestorePitchMinRow = uint64(cfg.CUDARestorePitchMinRow)
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
		return nil, fmt.Errorf("%w: CUDA device %d, this peer sees %d", engineapi.ErrInvalid, ordinal, g.count)
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
	g.enablePeers(gd)
	g.openStage(ordinal, gd)
	g.mu.devs[ordinal] = gd
	return gd, nil
}

// enablePeers turns on peer access both ways between a newly opened device
// and every device opened before, where the hardware allows it (NVLink or
// PCIe P2P): the HBM stage's GPU-to-GPU loads then read the other GPU's
// memory directly. Where it does not, those copies go through the driver's
// host staging, still correct. g.mu is held.
func (g *gpuState) enablePeers(gd *gpuDevice) {
	for _, o := range g.mu.devs {
		for _, p := range [][2]*cuda.Device{{gd.d, o.d}, {o.d, gd.d}} {
			can, err := p[0].CanAccessPeer(p[1])
			if err == nil && can {
				err = p[0].EnablePeerAccess(p[1])
			}
			g.log.Info().Int("device", p[0].Ordinal()).Int("peer", p[1].Ordinal()).Bool("peer_access", can && err == nil).
				AnErr("error", err).Msg("cuda: peer access between devices")
		}
	}
}

// openStage allocates device ordinal's HBM stage when --hbm-stage-bytes asks
// for one. A failed allocation (the engine took the HBM) leaves the device
// without a stage, logged: loads then come from DRAM.
func (g *gpuState) openStage(ordinal int, gd *gpuDevice) {
	if g.stageBytes == 0 {
		return
	}
	mem, err := gd.d.Alloc(g.stageBytes)
	if err != nil {
		g.log.Warn().Err(err).Int("device", ordinal).Uint64("bytes", g.stageBytes).Msg("hbm stage: allocation failed; this GPU's pages load from dram")
		return
	}
	r := &transfer.Region{Name: fmt.Sprintf("cuda%d/hbm-stage", ordinal), Kind: transfer.Device, Device: uint64(mem.Ptr), Ordinal: ordinal, Size: mem.Size}
	gd.mem, gd.stage = mem, store.NewHBMStage(ordinal, r, gd.xfer)
	g.addStage(gd.stage)
	g.log.Info().Int("device", ordinal).Uint64("bytes", mem.Size).Msg("hbm stage: saved pages kept in this GPU's memory for GPU-to-GPU loads")
}

// Stage returns device ordinal's HBM stage, nil without one (engineapi.GPU).
func (g *gpuState) Stage(ordinal int) *store.HBMStage {
	g.mu.Lock()
	defer g.mu.Unlock()
	if gd, ok := g.mu.devs[ordinal]; ok {
		return gd.stage
	}
	return nil
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
		if gd.mem != nil {
			errs = append(errs, gd.mem.Free())
		}
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

// gpuBatches exports each opened GPU's device batches by the copy method
// they went by, orbitkv_transfer_gpu_batches_total{device,method}: whether
// copies ran on the copy engines (batch, pitched) or on the SMs (kernel)
// shows on a serving peer, not only in bench gpu.
type gpuBatches struct {
	desc  *prometheus.Desc
	stats func() map[int]transfer.CUDAStats
}

func newGPUBatches(stats func() map[int]transfer.CUDAStats) gpuBatches {
	return gpuBatches{stats: stats, desc: prometheus.NewDesc("orbitkv_transfer_gpu_batches_total",
		"Device copy batches by GPU and the copy method they went by (auto resolves per batch).", []string{"device", "method"}, nil)}
}

func (g gpuBatches) Describe(ch chan<- *prometheus.Desc) { ch <- g.desc }

func (g gpuBatches) Collect(ch chan<- prometheus.Metric) {
	for dev, st := range g.stats() {
		for m, n := range st.ByMethod {
			ch <- prometheus.MustNewConstMetric(g.desc, prometheus.CounterValue, float64(n), strconv.Itoa(dev), m)
		}
	}
}

// GPUPhases is where CUDA sessions' whole-request loads and saves spent
// their time, by phase (fabric/store's phase timer).
type GPUPhases = store.GPUPhases

// GPUPhases returns the phase table since the peer started.
func (p *Peer) GPUPhases() GPUPhases { return p.pages.GPUPhases() }

// Copier returns device ordinal's transport, opening it on first use
// (engineapi.GPU).
func (g *gpuState) Copier(ordinal int) (store.DeviceCopier, error) {
	gd, err := g.device(ordinal)
	if err != nil {
		return nil, err
	}
	return gd.xfer, nil
}

// RegisterHBM registers a session's buffers on device ordinal with the RDMA
// engine where the device and the cluster can (engineapi.GPU; gpudirect.go),
// and logs which path the buffers take.
func (g *gpuState) RegisterHBM(ordinal int, bufs []*transfer.Region) func() {
	if g.verbs == nil {
		return func() {}
	}
	gd, err := g.device(ordinal)
	var release func() error
	if err == nil {
		release, err = registerHBM(g.verbs, gd.d, bufs)
	}
	if err != nil {
		ev := g.log.Info()
		if errors.Is(err, rdma.ErrNoDevice) { // no NIC: the usual case, said once at start
			ev = g.log.Debug()
		}
		ev.Int("device", ordinal).Str("reason", err.Error()).Msg("gpudirect: engine buffers not registered for RDMA; remote pages stage through DRAM")
		return func() {}
	}
	g.log.Info().Int("device", ordinal).Int("buffers", len(bufs)).Msg("gpudirect: engine buffers registered with the RDMA engine (dmabuf)")
	return func() {
		if err := release(); err != nil {
			g.log.Warn().Err(err).Int("device", ordinal).Msg("gpudirect: deregister engine buffers")
		}
	}
}

// Import maps an engine's CUDA IPC allocation on device ordinal
// (engineapi.GPU).
func (g *gpuState) Import(ordinal int, handle []byte, offset, size uint64) (*hbm.GPUBuffer, error) {
	gd, err := g.device(ordinal)
	if err != nil {
		return nil, err
	}
	return g.imp.Import(gd.d, handle, offset, size)
}
