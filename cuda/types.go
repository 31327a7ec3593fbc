package cuda

import (
	"errors"
	"fmt"
)

// DevicePtr is an address in a device's (unified) virtual address space.
type DevicePtr uint64

// IPCHandle is an exported CUDA IPC memory handle (CUipcMemHandle, the same
// 64 bytes as cudaIpcMemHandle_t and PyTorch's storage handle).
type IPCHandle [64]byte

// Direction says which way a batch moves.
type Direction int

const (
	// HostToDevice is a restore: DRAM tier → engine blocks.
	HostToDevice Direction = iota
	// DeviceToHost is a save: engine blocks → DRAM tier.
	DeviceToHost
)

func (d Direction) String() string {
	if d == HostToDevice {
		return "restore(h2d)"
	}
	return "save(d2h)"
}

// Segment is one contiguous copy between a HostRegion and device memory.
type Segment struct {
	HostOff uint64    // byte offset into the HostRegion
	Dev     DevicePtr // device address
	Len     uint64    // bytes
}

// PeerSegment is one contiguous device-to-device copy: Src in the memory of
// the batch's source device, Dst in the copier's device.
type PeerSegment struct {
	Src, Dst DevicePtr
	Len      uint64
}

// Method is how a Copier moves a batch.
type Method int

const (
	// MethodAuto picks the best method the driver supports (see Copier).
	MethodAuto Method = iota
	// MethodPerSegment is one cuMemcpyAsync per segment on one stream.
	MethodPerSegment
	// MethodStreams is one cuMemcpyAsync per segment over several streams.
	MethodStreams
	// MethodBatch is cuMemcpyBatchAsync (CUDA 12.8+ drivers).
	MethodBatch
	// MethodKernel is the gather/scatter kernel over mapped pinned memory.
	MethodKernel
	// MethodPitched folds runs of copies at constant strides (a page's
	// planes) into cuMemcpy2DAsync copies over several streams: the copy
	// engines move each run as one 2D transfer; copies in no run go one by
	// one.
	MethodPitched
)

var methodNames = [...]string{"auto", "per-segment", "streams", "batch", "kernel", "pitched"}

func (m Method) String() string {
	if m < 0 || int(m) >= len(methodNames) {
		return fmt.Sprintf("method(%d)", int(m))
	}
	return methodNames[m]
}

// ParseMethod is the inverse of Method.String.
func ParseMethod(s string) (Method, error) {
	for i, n := range methodNames {
		if n == s {
			return Method(i), nil
		}
	}
	return 0, fmt.Errorf("cuda: unknown copy method %q", s)
}

// DeviceInfo describes one GPU. PCIe and free-memory fields come from NVML
// and are zero when NVML is unavailable.
type DeviceInfo struct {
	Ordinal      int
	Name         string
	PCIBusID     string // "0000:xx:00.0"
	TotalMemory  uint64 // bytes
	FreeMemory   uint64 // bytes, from NVML at discovery time
	ComputeMajor int
	ComputeMinor int
	SMs          int // multiprocessors
	CopyEngines  int // CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT
	CanMapHost   bool
	PCIeGen      int // current link generation
	PCIeWidth    int // current link width (lanes)
	PCIeMaxGen   int
	PCIeMaxWidth int
}

// CopierConfig configures a Copier.
type CopierConfig struct {
	// Method is how batches move; MethodAuto (the zero value) picks one.
	Method Method
	// Streams is the number of streams for MethodStreams, MethodBatch and
	// MethodPitched (a batch is split across them). Default 4 for the first
	// two, 2 for pitched copies, 1 for the kernel (which launches once).
	Streams int
	// MaxSegments is the most segments one batch may hold (descriptor
	// buffers are sized for it). Default 16384 (≈ 227 Qwen3-8B pages).
	MaxSegments int
	// KernelChunk is the bytes one kernel thread block copies, a multiple of
	// KernelThreads×64. Default 65536.
	KernelChunk int
	// KernelThreads is the thread-block size of the copy kernel. Default 256.
	KernelThreads int
	// BatchFlags is passed to cuMemcpyBatchAsync's attributes (CUmemcpyFlags;
	// 1 = CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE). Default 0.
	BatchFlags uint32
	// BatchSrcAnyOrder lets host → device batches read their sources out
	// of stream order (CU_MEMCPY_SRC_ACCESS_ORDER_ANY, as vLLM's offloading
	// restores do; safe here: a restore's source is a pinned DRAM slot no
	// earlier work on the copier's streams writes). Off by default: on an
	// H100 it restored 16-token blocks no faster (4 streams 35.1 GB/s against
	// 34.7 in stream order) and slower on one stream (30.5 against 36.9).
	// Device → host batches always keep stream order.
	BatchSrcAnyOrder bool
	// RestorePitchMinRow: MethodAuto moves a host → device batch by pitched
	// copies only where their rows average at least this many bytes, else by
	// cuMemcpyBatchAsync (narrow rows: vLLM's 16-token blocks are 32 KiB per
	// layer and K or V). 0 (the default) leaves every batch that folds pitched:
	// on an H100 (2026-12-06) batched copies restored randomly placed 16-token
	// blocks through the peer faster (52.8 GB/s against 44.5), but vLLM 0.33's
	// own block placement slower (the 8K probe's load 33.8 ms against 30.0).
	RestorePitchMinRow uint64
}

func (c *CopierConfig) setDefaults() {
	if c.Streams == 0 {
		c.Streams = 1
		switch c.Method {
		case MethodStreams, MethodBatch:
			c.Streams = 4
		case MethodPitched:
			c.Streams = 2
		}
	}
	if c.MaxSegments == 0 {
		c.MaxSegments = 16384
	}
	if c.KernelThreads == 0 {
		c.KernelThreads = 256
	}
	if c.KernelChunk == 0 {
		c.KernelChunk = 65536
	}
}

// Validate checks the config after defaults are applied.
func (c CopierConfig) Validate() error {
	c.setDefaults()
	switch {
	case c.Method < MethodAuto || c.Method > MethodPitched:
		return fmt.Errorf("cuda: copier method %d out of range", int(c.Method))
	case c.Streams < 1 || c.Streams > 64:
		return fmt.Errorf("cuda: copier streams %d, want 1..64", c.Streams)
	case c.MaxSegments < 1 || c.MaxSegments > 1<<24:
		return fmt.Errorf("cuda: copier max segments %d, want 1..%d", c.MaxSegments, 1<<24)
	case c.KernelThreads < 32 || c.KernelThreads > 1024 || c.KernelThreads%32 != 0:
		return fmt.Errorf("cuda: kernel threads %d, want a multiple of 32 in 32..1024", c.KernelThreads)
	case c.KernelChunk <= 0 || c.KernelChunk%(c.KernelThreads*64) != 0:
		return fmt.Errorf("cuda: kernel chunk %d bytes, want a positive multiple of %d", c.KernelChunk, c.KernelThreads*64)
	}
	return nil
}

// ErrBadSegment reports a segment that does not fit its region or is empty.
var ErrBadSegment = errors.New("cuda: bad segment")
