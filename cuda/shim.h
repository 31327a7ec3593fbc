// Memory ownership: this header declares the C side of package cuda. The shim
// owns nothing but the dlopen handle and the function table, both process
// lifetime. Every pointer argument is borrowed for the duration of one call:
// Go memory passed in (descriptor arrays, name buffers) is never retained, and
// host memory handed to okv_mem_host_register is mmapped memory the caller
// keeps mapped until okv_mem_host_unregister returns.

#ifndef ORBITKV_CUDA_SHIM_H
#define ORBITKV_CUDA_SHIM_H

#include <stddef.h>
#include <stdint.h>

// The few driver API types we use, declared here so that no CUDA header or
// library is needed to build (values from cuda.h, stable since CUDA 4).
typedef int CUresult;
typedef int CUdevice;
typedef void *CUcontext;
typedef void *CUstream;
typedef void *CUevent;
typedef void *CUmodule;
typedef void *CUfunction;
typedef unsigned long long CUdeviceptr;
typedef struct { char reserved[64]; } CUipcMemHandle;
typedef struct { char reserved[64]; } CUipcEventHandle;

enum {
	OKV_CUDA_SUCCESS = 0,
	OKV_CUDA_ERROR_INVALID_VALUE = 1,
	OKV_CUDA_ERROR_NOT_INITIALIZED = 3,
	OKV_CUDA_ERROR_NO_DEVICE = 100,
	OKV_CUDA_ERROR_NOT_READY = 600,
	OKV_CUDA_ERROR_NOT_SUPPORTED = 801,
};

// One copy: src and dst are addresses in the unified address space (a host
// pointer or a device pointer), len bytes. Same layout as Go's cSeg.
typedef struct {
	uint64_t src;
	uint64_t dst;
	uint64_t len;
} okv_seg;

// Loads libcuda and resolves the symbol table. Returns 0 on success, else
// writes a message into err. Safe to call again after a failure.
int okv_load(const char *path, char *err, size_t errlen);
// Which cuMemcpyBatchAsync the driver exports: 0 none, 1 the CUDA 12.8 form
// (with failIdx), 2 the CUDA 13 form cuMemcpyBatchAsync_v2 (without).
int okv_batch_kind(void);

const char *okv_error_name(CUresult r);
const char *okv_error_string(CUresult r);

CUresult okv_init(void);
CUresult okv_driver_version(int *v);
CUresult okv_device_count(int *n);
CUresult okv_device_get(CUdevice *d, int ordinal);
CUresult okv_device_name(char *buf, int len, CUdevice d);
CUresult okv_device_total_mem(size_t *bytes, CUdevice d);
CUresult okv_device_attr(int *v, int attr, CUdevice d);
CUresult okv_device_pci_bus_id(char *buf, int len, CUdevice d);
CUresult okv_primary_ctx_retain(CUcontext *ctx, CUdevice d);
CUresult okv_primary_ctx_release(CUdevice d);
CUresult okv_can_access_peer(int *can, CUdevice d, CUdevice peer);
CUresult okv_enable_peer_access(CUcontext ctx, CUcontext peer);

// Every call below first makes ctx current on the calling OS thread; the
// current context is thread-local, so setting it inside the same C call is
// what keeps Go's goroutine migration from ever running a call under the
// wrong device.
CUresult okv_mem_get_info(CUcontext ctx, size_t *free_b, size_t *total_b);
CUresult okv_stream_create(CUcontext ctx, CUstream *s);
CUresult okv_stream_destroy(CUcontext ctx, CUstream s);
CUresult okv_stream_sync(CUcontext ctx, CUstream s);
CUresult okv_stream_wait_event(CUcontext ctx, CUstream s, CUevent e);
CUresult okv_event_create(CUcontext ctx, CUevent *e, int timing);
CUresult okv_event_destroy(CUcontext ctx, CUevent e);
CUresult okv_event_record(CUcontext ctx, CUevent e, CUstream s);
CUresult okv_event_query(CUcontext ctx, CUevent e);
CUresult okv_event_sync(CUcontext ctx, CUevent e);
CUresult okv_event_poll(CUcontext ctx, CUevent e, unsigned int budget_us, unsigned int sleep_ns);
CUresult okv_event_elapsed(CUcontext ctx, float *ms, CUevent start, CUevent end);
CUresult okv_mem_alloc(CUcontext ctx, CUdeviceptr *p, size_t n);
CUresult okv_mem_free(CUcontext ctx, CUdeviceptr p);
CUresult okv_mem_alloc_host(CUcontext ctx, void **p, size_t n);
CUresult okv_mem_free_host(CUcontext ctx, void *p);
CUresult okv_memset_d8(CUcontext ctx, CUdeviceptr p, unsigned char v, size_t n);
CUresult okv_mem_host_register(CUcontext ctx, void *p, size_t n, unsigned int flags);
CUresult okv_mem_host_unregister(CUcontext ctx, void *p);
CUresult okv_mem_host_device_pointer(CUcontext ctx, CUdeviceptr *dp, void *p);
CUresult okv_memcpy_htod(CUcontext ctx, CUdeviceptr dst, const void *src, size_t n);
CUresult okv_memcpy_dtoh(CUcontext ctx, void *dst, CUdeviceptr src, size_t n);
CUresult okv_memcpy_async(CUcontext ctx, int dir, uint64_t dst, uint64_t src, size_t n, CUstream s);
CUresult okv_memcpy_peer_async(CUcontext ctx, CUdeviceptr dst, CUcontext dst_ctx,
	CUdeviceptr src, CUcontext src_ctx, size_t n, CUstream s);
// An event another process can wait on (CU_EVENT_INTERPROCESS |
// CU_EVENT_DISABLE_TIMING), its 64-byte handle, and the importer's side.
CUresult okv_event_create_ipc(CUcontext ctx, CUevent *e);
CUresult okv_ipc_event_get(CUcontext ctx, CUipcEventHandle *h, CUevent e);
CUresult okv_ipc_event_open(CUcontext ctx, CUevent *e, const CUipcEventHandle *h);
CUresult okv_ipc_get(CUcontext ctx, CUipcMemHandle *h, CUdeviceptr p);
CUresult okv_ipc_open(CUcontext ctx, CUdeviceptr *p, const CUipcMemHandle *h);
CUresult okv_ipc_close(CUcontext ctx, CUdeviceptr p);
// The base and size of the allocation (or IPC mapping) that contains p.
CUresult okv_mem_address_range(CUcontext ctx, CUdeviceptr *base, size_t *size, CUdeviceptr p);
// Whether the driver exports cuMemGetHandleForAddressRange (CUDA 11.7+).
int okv_has_dmabuf(void);
// Exports n bytes of device memory at p as a dmabuf file descriptor
// (cuMemGetHandleForAddressRange, CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD, flags
// 0); on success *fd is the caller's to close. okv_has_dmabuf must be true.
CUresult okv_mem_dmabuf_fd(CUcontext ctx, int *fd, CUdeviceptr p, size_t n);
CUresult okv_module_load(CUcontext ctx, CUmodule *m, const char *image, char *log, size_t loglen);
CUresult okv_module_unload(CUcontext ctx, CUmodule m);
CUresult okv_module_function(CUcontext ctx, CUfunction *f, CUmodule m, const char *name);

// Direction of a copy: host to device (restore) or device to host (save).
enum { OKV_HTOD = 0, OKV_DTOH = 1 };

// Enqueues one cuMemcpy{HtoD,DtoH}Async per segment, segment i on stream
// streams[i % nstreams]. On failure *failed is the index that failed.
CUresult okv_copy_each(CUcontext ctx, int dir, const okv_seg *segs, size_t n,
	CUstream *streams, int nstreams, size_t *failed);
// Enqueues the segments as one cuMemcpyBatchAsync on s. dsts, srcs and sizes
// are scratch arrays of at least n entries owned by the caller. src_any: the
// sources may be read out of stream order (CU_MEMCPY_SRC_ACCESS_ORDER_ANY),
// for sources no earlier stream work writes.
CUresult okv_copy_batch(CUcontext ctx, const okv_seg *segs, size_t n, CUstream s,
	unsigned int flags, int src_any, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t *failed);
// A pitched copy: height rows of width bytes, row r from src + r*src_pitch
// to dst + r*dst_pitch. Same layout as Go's cRect.
typedef struct {
	uint64_t src;
	uint64_t dst;
	uint64_t width;
	uint64_t height;
	uint64_t src_pitch;
	uint64_t dst_pitch;
} okv_rect;
// Whether the driver exports cuMemcpy2DAsync_v2.
int okv_has_copy_2d(void);
// Enqueues one cuMemcpy2DAsync per rectangle, rectangle i on stream
// streams[i % nstreams]; the host side is pinned memory. On failure *failed
// is the index that failed.
CUresult okv_copy_2d(CUcontext ctx, int dir, const okv_rect *rects, size_t n,
	CUstream *streams, int nstreams, size_t *failed);
// Uploads n descriptors from pinned staging to dev_segs and launches the copy
// kernel f over them: grid (n, chunks), threads per block, chunk bytes each.
CUresult okv_launch_copy(CUcontext ctx, CUfunction f, CUdeviceptr dev_segs,
	const okv_seg *staging, size_t n, unsigned int chunk, unsigned int chunks,
	unsigned int threads, CUstream s);
// Launches the copy kernel over n descriptors already on the device at
// dev_segs (no upload): grid (n, chunks).
CUresult okv_launch_only(CUcontext ctx, CUfunction f, CUdeviceptr dev_segs, size_t n,
	unsigned int chunk, unsigned int chunks, unsigned int threads, CUstream s);

// Which stream memory operations the driver exports: 0 none, 1 the original
// cuStreamWaitValue32/WriteValue32 (need the device attribute
// CAN_USE_STREAM_MEM_OPS_V1), 2 the _v2 entry points (CUDA 11.7+).
int okv_memops_kind(void);
// Layer gates: for l in [0,n) enqueues on s a wait until words[l] >= gen
// (CU_STREAM_WAIT_VALUE_GEQ) and then a record of events[l]. On failure
// *failed is the layer that failed.
CUresult okv_gate_arm(CUcontext ctx, CUstream s, const CUdeviceptr *words, const CUevent *events,
	int n, uint32_t gen, int *failed);
// Enqueues *addr = v on s after everything before it (cuStreamWriteValue32).
CUresult okv_write_value32(CUcontext ctx, CUstream s, CUdeviceptr addr, uint32_t v);

#endif
