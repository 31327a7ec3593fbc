package transfer

import "fmt"

// MemKind says where a region's bytes live.
type MemKind uint8

const (
	// Host memory, addressable from Go as a byte slice.
	Host MemKind = iota
	// Device memory (GPU), addressed by a device pointer.
	Device
)

// Region is a registered range of memory that descriptors point into: the
// DRAM pool, an engine's shared-memory KV buffer, a GPU allocation.
type Region struct {
	Name   string
	Kind   MemKind
	Host   []byte // Host regions
	Device uint64 // Device regions: base device pointer
	// Ordinal is the CUDA device of a Device region (as the peer numbers
	// devices); a transport serves the regions of its own device only.
	Ordinal int
	Size    uint64
}

// HostRegion wraps host memory.
func HostRegion(name string, b []byte) *Region {
	return &Region{Name: name, Kind: Host, Host: b, Size: uint64(len(b))}
}

// Desc is one copy of Len bytes.
type Desc struct {
	Src, Dst       *Region
	SrcOff, DstOff uint64
	Len            uint64
}

func (d Desc) check() error {
	if d.SrcOff+d.Len > d.Src.Size || d.SrcOff+d.Len < d.SrcOff {
		return fmt.Errorf("copy of %d bytes at %d overruns %s (%d bytes)", d.Len, d.SrcOff, d.Src.Name, d.Src.Size)
	}
	if d.DstOff+d.Len > d.Dst.Size || d.DstOff+d.Len < d.DstOff {
		return fmt.Errorf("copy of %d bytes at %d overruns %s (%d bytes)", d.Len, d.DstOff, d.Dst.Name, d.Dst.Size)
	}
	return nil
}
