package hbm

// Memory ownership: a GPUBuffer borrows a mapping of another process's device
// allocation (cuda.IPCMapping). The Importer owns each mapping and counts the
// buffers that use it: engines describe several buffers inside one cudaMalloc
// block (PyTorch's caching allocator packs tensors into shared segments, and a
// process may open one IPC handle only once), so every (device, handle) pair
// is opened once and closed when its last buffer closes. The exporting
// engine owns the allocation and must keep it alive while its session lives.

import (
	"fmt"
	"sync"

	"github.com/orbitkv/orbitkv/cuda"
)

// IPCHandleBytes is the size of a CUDA IPC memory handle (cudaIpcMemHandle_t).
const IPCHandleBytes = len(cuda.IPCHandle{})

// GPUBuffer is an engine's KV buffer in GPU memory, imported by CUDA IPC
// handle: bytes [Ptr, Ptr+Size) of Device's address space in this process.
type GPUBuffer struct {
	Device int            // CUDA ordinal, as the peer numbers devices
	Ptr    cuda.DevicePtr // first byte of the buffer (mapping base + offset)
	Size   uint64         // bytes
	// AllocBytes is the size of the exporter's allocation as the driver
	// reports it (cuMemGetAddressRange), 0 where the driver would not say;
	// offset+size was checked against it.
	AllocBytes uint64

	imp    *Importer
	key    importKey
	closed bool
}

// Importer opens engine IPC handles and shares one mapping per (device,
// handle) among the buffers that name it. Safe for concurrent use.
type Importer struct {
	mu struct {
		sync.Mutex
		maps map[importKey]*ipcRef
	}
}

type importKey struct {
	dev    int
	handle cuda.IPCHandle
}

type ipcRef struct {
	m     *cuda.IPCMapping
	d     *cuda.Device
	alloc uint64 // allocation bytes; 0 = unknown
	refs  int
}

// NewImporter returns an empty importer.
func NewImporter() *Importer {
	im := &Importer{}
	im.mu.maps = make(map[importKey]*ipcRef)
	return im
}

// Import maps the buffer of size bytes at offset inside the allocation that
// handle names on device d. It checks the handle's length, that the buffer
// is non-empty and lies inside the allocation, and fails with ErrBuffer
// (wrapping the driver's error) when the handle cannot be opened.
func (im *Importer) Import(d *cuda.Device, handle []byte, offset, size uint64) (*GPUBuffer, error) {
	if len(handle) != IPCHandleBytes {
		return nil, fmt.Errorf("%w: CUDA IPC handle of %d bytes, want %d (strip PyTorch's 2-byte version/kind prefix)",
			ErrBuffer, len(handle), IPCHandleBytes)
	}
	if size == 0 || offset+size < offset {
		return nil, fmt.Errorf("%w: CUDA buffer of %d bytes at offset %d", ErrBuffer, size, offset)
	}
	key := importKey{dev: d.Ordinal()}
	copy(key.handle[:], handle)
	im.mu.Lock()
	defer im.mu.Unlock()
	r, err := im.openLocked(d, key)
	if err != nil {
		return nil, err
	}
	if r.alloc > 0 && offset+size > r.alloc {
		im.releaseLocked(key)
		return nil, fmt.Errorf("%w: CUDA buffer [%d, +%d) overruns the exported allocation of %d bytes",
			ErrBuffer, offset, size, r.alloc)
	}
	return &GPUBuffer{Device: key.dev, Ptr: r.m.Ptr + cuda.DevicePtr(offset), Size: size, AllocBytes: r.alloc, imp: im, key: key}, nil
}

func (im *Importer) openLocked(d *cuda.Device, key importKey) (*ipcRef, error) {
	if r, ok := im.mu.maps[key]; ok {
		r.refs++
		return r, nil
	}
	m, err := d.OpenIPC(key.handle)
	if err != nil {
		return nil, fmt.Errorf("%w: open CUDA IPC handle on device %d: %w", ErrBuffer, key.dev, err)
	}
	r := &ipcRef{m: m, d: d, refs: 1}
	if base, n, err := d.AddressRange(m.Ptr); err == nil && base == m.Ptr {
		r.alloc = n
	}
	im.mu.maps[key] = r
	return r, nil
}

func (im *Importer) releaseLocked(key importKey) error {
	r, ok := im.mu.maps[key]
	if !ok {
		return nil
	}
	if r.refs--; r.refs > 0 {
		return nil
	}
	delete(im.mu.maps, key)
	return r.m.Close()
}

// Mappings returns how many distinct allocations are mapped (tests, status).
func (im *Importer) Mappings() int {
	im.mu.Lock()
	defer im.mu.Unlock()
	return len(im.mu.maps)
}

// Close releases the buffer's mapping reference; the mapping is closed with
// its last buffer. No copy touching the buffer may be in flight. Idempotent.
func (b *GPUBuffer) Close() error {
	if b == nil || b.closed {
		return nil
	}
	b.closed = true
	b.imp.mu.Lock()
	defer b.imp.mu.Unlock()
	return b.imp.releaseLocked(b.key)
}

// ErrNoGPU reports a CUDA buffer offered to a peer that has no usable GPU; it
// is an ErrBuffer.
var ErrNoGPU = fmt.Errorf("%w: this peer has no usable CUDA device (libcuda missing, no GPU, or --cuda=off)", ErrBuffer)
