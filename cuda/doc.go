// Package cuda is OrbitKV's binding to the CUDA driver API: device discovery,
// primary contexts, streams and events, pinned registration of host memory,
// device allocations, CUDA IPC import of engine buffers, and batched
// scattered copies between pinned host memory and device memory (the page
// restore and save data path of DESIGN.md §6).
//
// # Loading
//
// libcuda.so.1 is opened with dlopen at Init and every entry point is
// resolved with dlsym into a small C shim (shim.c); nothing links against
// CUDA and no CUDA header is needed to build. On a machine without the
// driver, Init returns an error that wraps ErrNoDriver and names the
// library ("no libcuda.so.1: …"); nothing else crashes. Built with
// CGO_ENABLED=0 (or off Linux) every entry point returns ErrNotSupported.
// Discovery of PCIe link and memory goes through go-nvml, whose calls are
// made only after its Init succeeded (any call after a failed nvml.Init
// aborts the process).
//
// # Contexts and threads
//
// A Device holds its primary context (cuDevicePrimaryCtxRetain) until Close.
// The current context is thread-local state in the driver, so every shim
// function makes the device's context current on the calling thread inside
// the same C call before it touches the device: a cgo call runs on one OS
// thread from start to end, so no goroutine migration can run a call under
// another device's context, and no caller has to lock its OS thread.
//
// # Copies
//
// A Copier moves a batch of Segments between a HostRegion (an mmapped,
// pre-faulted region registered with cuMemHostRegister) and device memory, in
// one of five ways (Method): one cuMemcpyAsync per segment on one stream (the
// naive baseline), the same spread over several streams, one
// cuMemcpyBatchAsync call (CUDA 12.8+ drivers), a gather/scatter kernel
// shipped as PTX (kernels/copy.ptx, embedded) that reads or writes the
// mapped pinned host memory directly, or pitched copies: runs of segments
// at constant strides (a page's planes) folded into cuMemcpy2DAsync calls
// (plan.go rects). A Copier runs one batch at a time (a copy-engine batch
// takes more segments behind it: Pending.Add); use one Copier per
// concurrent batch.
//
// Measured on an H200 (PCIe gen5 x16, CUDA 13.0 driver) with Qwen3-8B pages
// (72 segments of 128 KiB each) scattered over a 16 GiB pool, against one
// contiguous pinned copy of the same bytes (55 GB/s each way), in three runs:
// per-segment copies 46–49% on one stream and no better on 2–8 (the enqueue
// is the limit); cuMemcpyBatchAsync 72–86% on one stream, 83–92% on 2,
// 90–95% on 4; the kernel 92% restore and 94–95% save every time; pitched
// copies of whole pages 96–97% both ways (a later session). MethodAuto takes
// pitched copies for a batch that folds (at least 4 segments per 2D copy),
// else cuMemcpyBatchAsync, and the kernel only on a driver without it:
// alone the kernel is as fast, but beside a serving engine it takes SMs
// from the engine (under vLLM on an H100 the copy engines served 8% more).
// `orbitkv bench gpu` (bench/gpu) measures it again.
//
// # Memory ownership
//
// Device memory, pinned host buffers, streams, events, modules and IPC
// mappings live outside the Go heap and are released by the Close or Free of
// the Go value that created them; finalizers are never relied on. Host memory
// passed to RegisterHost must not be Go heap memory: it is retained by the
// driver after the call returns.
package cuda
