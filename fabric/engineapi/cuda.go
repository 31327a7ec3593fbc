package engineapi

import (
	"fmt"

	"github.com/orbitkv/orbitkv/fabric/store"
	"github.com/orbitkv/orbitkv/tiers/hbm"
	"github.com/orbitkv/orbitkv/transfer"
)

// GPU is what CUDA sessions need of the peer's GPU side (fabric opens it;
// nil where there is no usable GPU, and CUDA sessions are refused).
type GPU interface {
	// Copier returns device ordinal's transport, opening the device on
	// first use; an ordinal the peer does not see is ErrInvalid.
	Copier(ordinal int) (store.DeviceCopier, error)
	// Import maps an engine's CUDA IPC allocation on device ordinal.
	Import(ordinal int, handle []byte, offset, size uint64) (*hbm.GPUBuffer, error)
	// Stage returns device ordinal's HBM stage, nil when the peer keeps
	// none (fabric/store/hbmstage.go).
	Stage(ordinal int) *store.HBMStage
	// RegisterHBM registers a session's imported buffers on device ordinal
	// with the RDMA engine for GPUDirect where it can (else they stay on
	// the DRAM staging path, and nothing is registered). The returned
	// release, never nil, undoes it; it runs before the buffers close.
	RegisterHBM(ordinal int, bufs []*transfer.Region) (release func())
}

// importCUDA maps a session's CUDA buffers; all of them must live on one
// device. On error nothing stays mapped.
func (p *API) importCUDA(s *session, specs []cudaSpec) error {
	if p.gpu == nil {
		return hbm.ErrNoGPU
	}
	dev := specs[0].device
	for i, b := range specs {
		if b.device != dev {
			return fmt.Errorf("%w: buffer %d is on CUDA device %d, buffer 0 on %d: one session, one device", ErrInvalid, i, b.device, dev)
		}
	}
	copier, err := p.gpu.Copier(dev)
	if err != nil {
		return err
	}
	var regions []*transfer.Region
	for i, b := range specs {
		buf, err := p.gpu.Import(dev, b.handle, b.offset, b.size)
		if err != nil {
			s.unmap()
			return fmt.Errorf("buffer %d: %w", i, err)
		}
		s.gpuBufs = append(s.gpuBufs, buf)
		regions = append(regions, &transfer.Region{Name: fmt.Sprintf("cuda%d/buffer%d", dev, i), Kind: transfer.Device,
			Device: uint64(buf.Ptr), Ordinal: dev, Size: buf.Size})
	}
	s.Bufs = append(s.Bufs, regions...)
	s.hbmRelease = p.gpu.RegisterHBM(dev, regions)
	s.GPU = copier
	s.Stage = p.gpu.Stage(dev)
	p.openMarks(s)
	return nil
}

// openMarks gives a CUDA session its per-layer interprocess events, the
// layer-wise load capability; without them (an old driver, no IPC events)
// the session works as before and announces no layer events.
func (p *API) openMarks(s *session) {
	m, err := s.GPU.NewMarks(len(s.Geom.Segments) / 2)
	if err != nil {
		p.log.Info().Str("reason", err.Error()).Str("session", s.id).Msg("cuda: no layer events; layer-wise loads off for this session")
		return
	}
	s.Marks = m
}

// cudaSpec is a validated CUDA IPC buffer of an OpenSession request.
type cudaSpec struct {
	handle []byte
	device int
	offset uint64
	size   uint64
}
