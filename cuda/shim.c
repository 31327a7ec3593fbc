//go:build cgo && linux

// Memory ownership: the shim holds the dlopen handle of libcuda and a table
// of function pointers, both for the life of the process (never dlclosed, so
// no pointer into the library can dangle). It allocates nothing else: device
// memory, pinned host buffers, streams, events and modules are created here
// on behalf of Go objects that own them and release them through the matching
// okv_* call. Arrays passed in (descriptors, scratch) are borrowed for one call.

#include "shim.h"

#include <dlfcn.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

static void *lib;

// Function pointer types and the table, one line per driver entry point.
#define OKV_FN(ret, name, args) typedef ret(*name##_fn) args; static name##_fn p_##name;
OKV_FN(CUresult, cuInit, (unsigned int))
OKV_FN(CUresult, cuDriverGetVersion, (int *))
OKV_FN(CUresult, cuGetErrorName, (CUresult, const char **))
OKV_FN(CUresult, cuGetErrorString, (CUresult, const char **))
OKV_FN(CUresult, cuDeviceGetCount, (int *))
OKV_FN(CUresult, cuDeviceGet, (CUdevice *, int))
OKV_FN(CUresult, cuDeviceGetName, (char *, int, CUdevice))
OKV_FN(CUresult, cuDeviceTotalMem, (size_t *, CUdevice))
OKV_FN(CUresult, cuDeviceGetAttribute, (int *, int, CUdevice))
OKV_FN(CUresult, cuDeviceGetPCIBusId, (char *, int, CUdevice))
OKV_FN(CUresult, cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))
OKV_FN(CUresult, cuDevicePrimaryCtxRelease, (CUdevice))
OKV_FN(CUresult, cuDeviceCanAccessPeer, (int *, CUdevice, CUdevice))
OKV_FN(CUresult, cuCtxEnablePeerAccess, (CUcontext, unsigned int))
OKV_FN(CUresult, cuCtxSetCurrent, (CUcontext))
OKV_FN(CUresult, cuMemGetInfo, (size_t *, size_t *))
OKV_FN(CUresult, cuStreamCreate, (CUstream *, unsigned int))
OKV_FN(CUresult, cuStreamDestroy, (CUstream))
OKV_FN(CUresult, cuStreamSynchronize, (CUstream))
OKV_FN(CUresult, cuStreamWaitEvent, (CUstream, CUevent, unsigned int))
OKV_FN(CUresult, cuEventCreate, (CUevent *, unsigned int))
OKV_FN(CUresult, cuEventDestroy, (CUevent))
OKV_FN(CUresult, cuEventRecord, (CUevent, CUstream))
OKV_FN(CUresult, cuEventQuery, (CUevent))
OKV_FN(CUresult, cuEventSynchronize, (CUevent))
OKV_FN(CUresult, cuEventElapsedTime, (float *, CUevent, CUevent))
OKV_FN(CUresult, cuMemAlloc, (CUdeviceptr *, size_t))
OKV_FN(CUresult, cuMemFree, (CUdeviceptr))
OKV_FN(CUresult, cuMemAllocHost, (void **, size_t))
OKV_FN(CUresult, cuMemFreeHost, (void *))
OKV_FN(CUresult, cuMemsetD8, (CUdeviceptr, unsigned char, size_t))
OKV_FN(CUresult, cuMemHostRegister, (void *, size_t, unsigned int))
OKV_FN(CUresult, cuMemHostUnregister, (void *))
OKV_FN(CUresult, cuMemHostGetDevicePointer, (CUdeviceptr *, void *, unsigned int))
OKV_FN(CUresult, cuMemcpyHtoD, (CUdeviceptr, const void *, size_t))
OKV_FN(CUresult, cuMemcpyDtoH, (void *, CUdeviceptr, size_t))
OKV_FN(CUresult, cuMemcpyHtoDAsync, (CUdeviceptr, const void *, size_t, CUstream))
OKV_FN(CUresult, cuMemcpyDtoHAsync, (void *, CUdeviceptr, size_t, CUstream))
OKV_FN(CUresult, cuMemcpyPeerAsync, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t, CUstream))
OKV_FN(CUresult, cuIpcGetMemHandle, (CUipcMemHandle *, CUdeviceptr))
OKV_FN(CUresult, cuIpcGetEventHandle, (CUipcEventHandle *, CUevent))
OKV_FN(CUresult, cuIpcOpenEventHandle, (CUevent *, CUipcEventHandle))
OKV_FN(CUresult, cuIpcOpenMemHandle, (CUdeviceptr *, CUipcMemHandle, unsigned int))
OKV_FN(CUresult, cuIpcCloseMemHandle, (CUdeviceptr))
OKV_FN(CUresult, cuMemGetAddressRange, (CUdeviceptr *, size_t *, CUdeviceptr))
OKV_FN(CUresult, cuModuleLoadDataEx, (CUmodule *, const void *, unsigned int, int *, void **))
OKV_FN(CUresult, cuModuleUnload, (CUmodule))
OKV_FN(CUresult, cuModuleGetFunction, (CUfunction *, CUmodule, const char *))
OKV_FN(CUresult, cuLaunchKernel, (CUfunction, unsigned int, unsigned int, unsigned int,
	unsigned int, unsigned int, unsigned int, unsigned int, CUstream, void **, void **))
#undef OKV_FN

// cuMemcpyBatchAsync: CUmemLocation is {type, id}; CUmemcpyAttributes is
// {srcAccessOrder, srcLocHint, dstLocHint, flags} (cuda.h, CUDA 12.8+).
typedef struct { int type; int id; } okv_mem_location;
typedef struct {
	int src_access_order;
	okv_mem_location src_loc_hint;
	okv_mem_location dst_loc_hint;
	unsigned int flags;
} okv_memcpy_attrs;
enum { OKV_SRC_ACCESS_ORDER_STREAM = 1, OKV_SRC_ACCESS_ORDER_ANY = 3 };
// CUDA 12.8: cuMemcpyBatchAsync(dsts, srcs, sizes, count, attrs, attrsIdxs,
// numAttrs, failIdx, stream). CUDA 13.0 renamed the entry point to
// cuMemcpyBatchAsync_v2 and dropped failIdx.
typedef CUresult (*batch_v1_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
	okv_memcpy_attrs *, size_t *, size_t, size_t *, CUstream);
typedef CUresult (*batch_v2_fn)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t,
	okv_memcpy_attrs *, size_t *, size_t, CUstream);
static batch_v1_fn p_batch_v1;
static batch_v2_fn p_batch_v2;

// Stream memory operations (optional): cuStreamWaitValue32(stream, addr,
// value, flags) and cuStreamWriteValue32, the same signature in both forms.
// CUDA 11.7+ drivers export the _v2 entry points, usable on every device that
// runs them; the original names need CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1.
typedef CUresult (*value32_fn)(CUstream, CUdeviceptr, uint32_t, unsigned int);

// cuMemcpy2DAsync: CUDA_MEMCPY2D as in cuda.h (unchanged since CUDA 3.2).
// CUmemorytype: 1 host, 2 device.
typedef struct {
	size_t src_x, src_y;
	int src_type;
	const void *src_host;
	CUdeviceptr src_device;
	void *src_array;
	size_t src_pitch;
	size_t dst_x, dst_y;
	int dst_type;
	void *dst_host;
	CUdeviceptr dst_device;
	void *dst_array;
	size_t dst_pitch;
	size_t width, height;
} okv_memcpy2d;
typedef CUresult (*copy2d_fn)(const okv_memcpy2d *, CUstream);
static copy2d_fn p_copy2d;
static value32_fn p_wait32, p_write32;
static int memops_kind;

// cuMemGetHandleForAddressRange(handle, dptr, size, handleType, flags)
// (optional, CUDA 11.7+): with CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD (1)
// handle is an int, a dmabuf file descriptor the caller then owns.
typedef CUresult (*range_handle_fn)(void *, CUdeviceptr, size_t, int, unsigned long long);
static range_handle_fn p_range_handle;
enum { OKV_RANGE_HANDLE_DMA_BUF_FD = 1 };

static void *sym(const char *name, const char *alt) {
	void *p = dlsym(lib, name);
	if (p == NULL && alt != NULL) p = dlsym(lib, alt);
	return p;
}

#define REQ(field, name, alt)                                                   \
	do {                                                                        \
		*(void **)(&p_##field) = sym(name, alt);                                \
		if (p_##field == NULL) {                                                \
			snprintf(err, errlen, "%s: missing symbol %s", path, name);         \
			dlclose(lib);                                                       \
			lib = NULL;                                                         \
			return -1;                                                          \
		}                                                                       \
	} while (0)

int okv_load(const char *path, char *err, size_t errlen) {
	void *h = dlopen(path, RTLD_NOW | RTLD_LOCAL);
	if (h == NULL) {
		const char *e = dlerror();
		snprintf(err, errlen, "%s", e ? e : "dlopen failed");
		return -1;
	}
	if (lib != NULL) { // already loaded: drop the extra reference
		dlclose(h);
		return 0;
	}
	lib = h;
	REQ(cuInit, "cuInit", NULL);
	REQ(cuDriverGetVersion, "cuDriverGetVersion", NULL);
	REQ(cuGetErrorName, "cuGetErrorName", NULL);
	REQ(cuGetErrorString, "cuGetErrorString", NULL);
	REQ(cuDeviceGetCount, "cuDeviceGetCount", NULL);
	REQ(cuDeviceGet, "cuDeviceGet", NULL);
	REQ(cuDeviceGetName, "cuDeviceGetName", NULL);
	REQ(cuDeviceTotalMem, "cuDeviceTotalMem_v2", NULL);
	REQ(cuDeviceGetAttribute, "cuDeviceGetAttribute", NULL);
	REQ(cuDeviceGetPCIBusId, "cuDeviceGetPCIBusId", NULL);
	REQ(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", NULL);
	REQ(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease");
	REQ(cuDeviceCanAccessPeer, "cuDeviceCanAccessPeer", NULL);
	REQ(cuCtxEnablePeerAccess, "cuCtxEnablePeerAccess", NULL);
	REQ(cuCtxSetCurrent, "cuCtxSetCurrent", NULL);
	REQ(cuMemGetInfo, "cuMemGetInfo_v2", NULL);
	REQ(cuStreamCreate, "cuStreamCreate", NULL);
	REQ(cuStreamDestroy, "cuStreamDestroy_v2", "cuStreamDestroy");
	REQ(cuStreamSynchronize, "cuStreamSynchronize", NULL);
	REQ(cuStreamWaitEvent, "cuStreamWaitEvent", NULL);
	REQ(cuEventCreate, "cuEventCreate", NULL);
	REQ(cuEventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
	REQ(cuEventRecord, "cuEventRecord", NULL);
	REQ(cuEventQuery, "cuEventQuery", NULL);
	REQ(cuEventSynchronize, "cuEventSynchronize", NULL);
	REQ(cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime");
	REQ(cuMemAlloc, "cuMemAlloc_v2", NULL);
	REQ(cuMemFree, "cuMemFree_v2", NULL);
	REQ(cuMemAllocHost, "cuMemAllocHost_v2", NULL);
	REQ(cuMemFreeHost, "cuMemFreeHost", NULL);
	REQ(cuMemsetD8, "cuMemsetD8_v2", NULL);
	REQ(cuMemHostRegister, "cuMemHostRegister_v2", "cuMemHostRegister");
	REQ(cuMemHostUnregister, "cuMemHostUnregister", NULL);
	REQ(cuMemHostGetDevicePointer, "cuMemHostGetDevicePointer_v2", NULL);
	REQ(cuMemcpyHtoD, "cuMemcpyHtoD_v2", NULL);
	REQ(cuMemcpyDtoH, "cuMemcpyDtoH_v2", NULL);
	REQ(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", NULL);
	REQ(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", NULL);
	REQ(cuMemcpyPeerAsync, "cuMemcpyPeerAsync", NULL);
	REQ(cuIpcGetMemHandle, "cuIpcGetMemHandle", NULL);
	REQ(cuIpcGetEventHandle, "cuIpcGetEventHandle", NULL);
	REQ(cuIpcOpenEventHandle, "cuIpcOpenEventHandle", NULL);
	REQ(cuIpcOpenMemHandle, "cuIpcOpenMemHandle_v2", "cuIpcOpenMemHandle");
	REQ(cuIpcCloseMemHandle, "cuIpcCloseMemHandle", NULL);
	REQ(cuMemGetAddressRange, "cuMemGetAddressRange_v2", NULL);
	REQ(cuModuleLoadDataEx, "cuModuleLoadDataEx", NULL);
	REQ(cuModuleUnload, "cuModuleUnload", NULL);
	REQ(cuModuleGetFunction, "cuModuleGetFunction", NULL);
	REQ(cuLaunchKernel, "cuLaunchKernel", NULL);
	// Optional: the batched copy exists from CUDA 12.8 drivers on. We enqueue
	// on explicit streams only, so the per-thread-stream (_ptsz) variants are
	// not needed: they differ only in how the legacy NULL stream is read.
	*(void **)(&p_batch_v2) = dlsym(lib, "cuMemcpyBatchAsync_v2");
	if (p_batch_v2 == NULL) *(void **)(&p_batch_v1) = dlsym(lib, "cuMemcpyBatchAsync");
	*(void **)(&p_copy2d) = dlsym(lib, "cuMemcpy2DAsync_v2");
	*(void **)(&p_range_handle) = dlsym(lib, "cuMemGetHandleForAddressRange");
	*(void **)(&p_wait32) = dlsym(lib, "cuStreamWaitValue32_v2");
	*(void **)(&p_write32) = dlsym(lib, "cuStreamWriteValue32_v2");
	memops_kind = 2;
	if (p_wait32 == NULL || p_write32 == NULL) {
		*(void **)(&p_wait32) = dlsym(lib, "cuStreamWaitValue32");
		*(void **)(&p_write32) = dlsym(lib, "cuStreamWriteValue32");
		memops_kind = 1;
	}
	if (p_wait32 == NULL || p_write32 == NULL) {
		p_wait32 = NULL;
		p_write32 = NULL;
		memops_kind = 0;
	}
	return 0;
}
#undef REQ

int okv_batch_kind(void) {
	if (p_batch_v2 != NULL) return 2;
	if (p_batch_v1 != NULL) return 1;
	return 0;
}

int okv_memops_kind(void) { return memops_kind; }

const char *okv_error_name(CUresult r) {
	const char *s = NULL;
	if (p_cuGetErrorName == NULL || p_cuGetErrorName(r, &s) != 0 || s == NULL) return "CUDA_ERROR_UNKNOWN";
	return s;
}

const char *okv_error_string(CUresult r) {
	const char *s = NULL;
	if (p_cuGetErrorString == NULL || p_cuGetErrorString(r, &s) != 0 || s == NULL) return "unknown error";
	return s;
}

#define SETCTX(ctx)                             \
	do {                                        \
		CUresult _r = p_cuCtxSetCurrent(ctx);   \
		if (_r != 0) return _r;                 \
	} while (0)

CUresult okv_init(void) { return p_cuInit(0); }
CUresult okv_driver_version(int *v) { return p_cuDriverGetVersion(v); }
CUresult okv_device_count(int *n) { return p_cuDeviceGetCount(n); }
CUresult okv_device_get(CUdevice *d, int ordinal) { return p_cuDeviceGet(d, ordinal); }
CUresult okv_device_name(char *buf, int len, CUdevice d) { return p_cuDeviceGetName(buf, len, d); }
CUresult okv_device_total_mem(size_t *b, CUdevice d) { return p_cuDeviceTotalMem(b, d); }
CUresult okv_device_attr(int *v, int attr, CUdevice d) { return p_cuDeviceGetAttribute(v, attr, d); }
CUresult okv_device_pci_bus_id(char *buf, int len, CUdevice d) { return p_cuDeviceGetPCIBusId(buf, len, d); }
CUresult okv_primary_ctx_retain(CUcontext *ctx, CUdevice d) { return p_cuDevicePrimaryCtxRetain(ctx, d); }
CUresult okv_primary_ctx_release(CUdevice d) { return p_cuDevicePrimaryCtxRelease(d); }
CUresult okv_can_access_peer(int *can, CUdevice d, CUdevice peer) { return p_cuDeviceCanAccessPeer(can, d, peer); }
CUresult okv_enable_peer_access(CUcontext ctx, CUcontext peer) { SETCTX(ctx); return p_cuCtxEnablePeerAccess(peer, 0); }

CUresult okv_mem_get_info(CUcontext ctx, size_t *f, size_t *t) { SETCTX(ctx); return p_cuMemGetInfo(f, t); }
// CU_STREAM_NON_BLOCKING (1): never synchronise with the legacy NULL stream.
CUresult okv_stream_create(CUcontext ctx, CUstream *s) { SETCTX(ctx); return p_cuStreamCreate(s, 1); }
CUresult okv_stream_destroy(CUcontext ctx, CUstream s) { SETCTX(ctx); return p_cuStreamDestroy(s); }
CUresult okv_stream_sync(CUcontext ctx, CUstream s) { SETCTX(ctx); return p_cuStreamSynchronize(s); }
CUresult okv_stream_wait_event(CUcontext ctx, CUstream s, CUevent e) { SETCTX(ctx); return p_cuStreamWaitEvent(s, e, 0); }
// CU_EVENT_DISABLE_TIMING (2) unless timing is asked for.
CUresult okv_event_create(CUcontext ctx, CUevent *e, int timing) { SETCTX(ctx); return p_cuEventCreate(e, timing ? 0 : 2); }
CUresult okv_event_destroy(CUcontext ctx, CUevent e) { SETCTX(ctx); return p_cuEventDestroy(e); }
CUresult okv_event_record(CUcontext ctx, CUevent e, CUstream s) { SETCTX(ctx); return p_cuEventRecord(e, s); }
CUresult okv_event_query(CUcontext ctx, CUevent e) { SETCTX(ctx); return p_cuEventQuery(e); }
CUresult okv_event_sync(CUcontext ctx, CUevent e) { SETCTX(ctx); return p_cuEventSynchronize(e); }
// okv_event_poll queries e until it completes or budget_us have passed,
// sleeping sleep_ns between queries in nanosleep (which blocks only this
// thread, with the kernel's timer precision: tens of microseconds, where a
// Go timer this short rounds up to the runtime's millisecond poll). Returns
// CUDA_ERROR_NOT_READY when the budget ran out first.
CUresult okv_event_poll(CUcontext ctx, CUevent e, unsigned int budget_us, unsigned int sleep_ns) {
	SETCTX(ctx);
	struct timespec t0, t, nap = {0, (long)sleep_ns};
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		CUresult r = p_cuEventQuery(e);
		if (r != OKV_CUDA_ERROR_NOT_READY) return r;
		clock_gettime(CLOCK_MONOTONIC, &t);
		long long us = (long long)(t.tv_sec - t0.tv_sec) * 1000000LL + (t.tv_nsec - t0.tv_nsec) / 1000;
		if (us >= (long long)budget_us) return r;
		nanosleep(&nap, NULL);
	}
}
CUresult okv_event_elapsed(CUcontext ctx, float *ms, CUevent a, CUevent b) { SETCTX(ctx); return p_cuEventElapsedTime(ms, a, b); }
CUresult okv_mem_alloc(CUcontext ctx, CUdeviceptr *p, size_t n) { SETCTX(ctx); return p_cuMemAlloc(p, n); }
CUresult okv_mem_free(CUcontext ctx, CUdeviceptr p) { SETCTX(ctx); return p_cuMemFree(p); }
CUresult okv_mem_alloc_host(CUcontext ctx, void **p, size_t n) { SETCTX(ctx); return p_cuMemAllocHost(p, n); }
CUresult okv_mem_free_host(CUcontext ctx, void *p) { SETCTX(ctx); return p_cuMemFreeHost(p); }
CUresult okv_memset_d8(CUcontext ctx, CUdeviceptr p, unsigned char v, size_t n) { SETCTX(ctx); return p_cuMemsetD8(p, v, n); }
CUresult okv_mem_host_register(CUcontext ctx, void *p, size_t n, unsigned int flags) { SETCTX(ctx); return p_cuMemHostRegister(p, n, flags); }
CUresult okv_mem_host_unregister(CUcontext ctx, void *p) { SETCTX(ctx); return p_cuMemHostUnregister(p); }
CUresult okv_mem_host_device_pointer(CUcontext ctx, CUdeviceptr *dp, void *p) { SETCTX(ctx); return p_cuMemHostGetDevicePointer(dp, p, 0); }
CUresult okv_memcpy_htod(CUcontext ctx, CUdeviceptr dst, const void *src, size_t n) { SETCTX(ctx); return p_cuMemcpyHtoD(dst, src, n); }
CUresult okv_memcpy_dtoh(CUcontext ctx, void *dst, CUdeviceptr src, size_t n) { SETCTX(ctx); return p_cuMemcpyDtoH(dst, src, n); }

CUresult okv_memcpy_async(CUcontext ctx, int dir, uint64_t dst, uint64_t src, size_t n, CUstream s) {
	SETCTX(ctx);
	if (dir == OKV_HTOD) return p_cuMemcpyHtoDAsync((CUdeviceptr)dst, (const void *)(uintptr_t)src, n, s);
	return p_cuMemcpyDtoHAsync((void *)(uintptr_t)dst, (CUdeviceptr)src, n, s);
}

CUresult okv_memcpy_peer_async(CUcontext ctx, CUdeviceptr dst, CUcontext dst_ctx,
		CUdeviceptr src, CUcontext src_ctx, size_t n, CUstream s) {
	SETCTX(ctx);
	return p_cuMemcpyPeerAsync(dst, dst_ctx, src, src_ctx, n, s);
}

// CU_EVENT_DISABLE_TIMING (2) | CU_EVENT_INTERPROCESS (4): required together.
CUresult okv_event_create_ipc(CUcontext ctx, CUevent *e) { SETCTX(ctx); return p_cuEventCreate(e, 2 | 4); }
CUresult okv_ipc_event_get(CUcontext ctx, CUipcEventHandle *h, CUevent e) { SETCTX(ctx); return p_cuIpcGetEventHandle(h, e); }
CUresult okv_ipc_event_open(CUcontext ctx, CUevent *e, const CUipcEventHandle *h) { SETCTX(ctx); return p_cuIpcOpenEventHandle(e, *h); }
CUresult okv_ipc_get(CUcontext ctx, CUipcMemHandle *h, CUdeviceptr p) { SETCTX(ctx); return p_cuIpcGetMemHandle(h, p); }
// CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS (1), as the runtime's cudaIpcOpenMemHandle.
CUresult okv_ipc_open(CUcontext ctx, CUdeviceptr *p, const CUipcMemHandle *h) { SETCTX(ctx); return p_cuIpcOpenMemHandle(p, *h, 1); }
CUresult okv_ipc_close(CUcontext ctx, CUdeviceptr p) { SETCTX(ctx); return p_cuIpcCloseMemHandle(p); }
CUresult okv_mem_address_range(CUcontext ctx, CUdeviceptr *base, size_t *size, CUdeviceptr p) { SETCTX(ctx); return p_cuMemGetAddressRange(base, size, p); }

int okv_has_dmabuf(void) { return p_range_handle != NULL; }
CUresult okv_mem_dmabuf_fd(CUcontext ctx, int *fd, CUdeviceptr p, size_t n) {
	SETCTX(ctx);
	*fd = -1;
	return p_range_handle(fd, p, n, OKV_RANGE_HANDLE_DMA_BUF_FD, 0);
}

CUresult okv_module_load(CUcontext ctx, CUmodule *m, const char *image, char *log, size_t loglen) {
	SETCTX(ctx);
	// CU_JIT_ERROR_LOG_BUFFER (5) and CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES (6).
	int opts[2] = {5, 6};
	void *vals[2] = {log, (void *)(uintptr_t)loglen};
	if (loglen > 0) log[0] = 0;
	return p_cuModuleLoadDataEx(m, image, 2, opts, vals);
}
CUresult okv_module_unload(CUcontext ctx, CUmodule m) { SETCTX(ctx); return p_cuModuleUnload(m); }
CUresult okv_module_function(CUcontext ctx, CUfunction *f, CUmodule m, const char *name) { SETCTX(ctx); return p_cuModuleGetFunction(f, m, name); }

CUresult okv_copy_each(CUcontext ctx, int dir, const okv_seg *segs, size_t n,
		CUstream *streams, int nstreams, size_t *failed) {
	SETCTX(ctx);
	for (size_t i = 0; i < n; i++) {
		CUstream s = streams[i % (size_t)nstreams];
		CUresult r = dir == OKV_HTOD
			? p_cuMemcpyHtoDAsync((CUdeviceptr)segs[i].dst, (const void *)(uintptr_t)segs[i].src, segs[i].len, s)
			: p_cuMemcpyDtoHAsync((void *)(uintptr_t)segs[i].dst, (CUdeviceptr)segs[i].src, segs[i].len, s);
		if (r != 0) {
			*failed = i;
			return r;
		}
	}
	return 0;
}

CUresult okv_copy_batch(CUcontext ctx, const okv_seg *segs, size_t n, CUstream s,
		unsigned int flags, int src_any, CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t *failed) {
	SETCTX(ctx);
	if (p_batch_v1 == NULL && p_batch_v2 == NULL) return OKV_CUDA_ERROR_NOT_SUPPORTED;
	for (size_t i = 0; i < n; i++) {
		dsts[i] = segs[i].dst;
		srcs[i] = segs[i].src;
		sizes[i] = segs[i].len;
	}
	okv_memcpy_attrs attr;
	memset(&attr, 0, sizeof attr);
	attr.src_access_order = src_any ? OKV_SRC_ACCESS_ORDER_ANY : OKV_SRC_ACCESS_ORDER_STREAM;
	attr.flags = flags;
	size_t idx = 0;
	*failed = (size_t)-1;
	if (p_batch_v2 != NULL) return p_batch_v2(dsts, srcs, sizes, n, &attr, &idx, 1, s);
	return p_batch_v1(dsts, srcs, sizes, n, &attr, &idx, 1, failed, s);
}

int okv_has_copy_2d(void) { return p_copy2d != NULL; }

CUresult okv_copy_2d(CUcontext ctx, int dir, const okv_rect *rects, size_t n,
		CUstream *streams, int nstreams, size_t *failed) {
	SETCTX(ctx);
	if (p_copy2d == NULL) return OKV_CUDA_ERROR_NOT_SUPPORTED;
	okv_memcpy2d m;
	for (size_t i = 0; i < n; i++) {
		const okv_rect *r = &rects[i];
		CUstream s = streams[i % (size_t)nstreams];
		CUresult res;
		if (r->height == 1) { // a lone copy: the plain call, cheaper and without pitch limits
			res = dir == OKV_HTOD
				? p_cuMemcpyHtoDAsync((CUdeviceptr)r->dst, (const void *)(uintptr_t)r->src, r->width, s)
				: p_cuMemcpyDtoHAsync((void *)(uintptr_t)r->dst, (CUdeviceptr)r->src, r->width, s);
			if (res != 0) {
				*failed = i;
				return res;
			}
			continue;
		}
		memset(&m, 0, sizeof m);
		if (dir == OKV_HTOD) {
			m.src_type = 1, m.src_host = (const void *)(uintptr_t)r->src;
			m.dst_type = 2, m.dst_device = (CUdeviceptr)r->dst;
		} else {
			m.src_type = 2, m.src_device = (CUdeviceptr)r->src;
			m.dst_type = 1, m.dst_host = (void *)(uintptr_t)r->dst;
		}
		m.src_pitch = r->src_pitch, m.dst_pitch = r->dst_pitch;
		m.width = r->width, m.height = r->height;
		res = p_copy2d(&m, s);
		if (res != 0) {
			*failed = i;
			return res;
		}
	}
	return 0;
}

CUresult okv_launch_copy(CUcontext ctx, CUfunction f, CUdeviceptr dev_segs,
		const okv_seg *staging, size_t n, unsigned int chunk, unsigned int chunks,
		unsigned int threads, CUstream s) {
	SETCTX(ctx);
	CUresult r = p_cuMemcpyHtoDAsync(dev_segs, staging, n * sizeof(okv_seg), s);
	if (r != 0) return r;
	return okv_launch_only(ctx, f, dev_segs, n, chunk, chunks, threads, s);
}

CUresult okv_launch_only(CUcontext ctx, CUfunction f, CUdeviceptr dev_segs, size_t n,
		unsigned int chunk, unsigned int chunks, unsigned int threads, CUstream s) {
	SETCTX(ctx);
	void *args[2] = {&dev_segs, &chunk};
	return p_cuLaunchKernel(f, (unsigned int)n, chunks, 1, threads, 1, 1, 0, s, args, NULL);
}

// CU_STREAM_WAIT_VALUE_GEQ (0): wait until (int32_t)(*addr - value) >= 0, so
// a generation counter that wraps still compares right.
CUresult okv_gate_arm(CUcontext ctx, CUstream s, const CUdeviceptr *words, const CUevent *events,
		int n, uint32_t gen, int *failed) {
	SETCTX(ctx);
	if (p_wait32 == NULL) return OKV_CUDA_ERROR_NOT_SUPPORTED;
	for (int l = 0; l < n; l++) {
		CUresult r = p_wait32(s, words[l], gen, 0);
		if (r == 0) r = p_cuEventRecord(events[l], s);
		if (r != 0) {
			*failed = l;
			return r;
		}
	}
	return 0;
}

// CU_STREAM_WRITE_VALUE_DEFAULT (0): the write is fenced after every earlier
// write of the stream, so a waiter that sees it sees the copies before it.
CUresult okv_write_value32(CUcontext ctx, CUstream s, CUdeviceptr addr, uint32_t v) {
	SETCTX(ctx);
	if (p_write32 == NULL) return OKV_CUDA_ERROR_NOT_SUPPORTED;
	return p_write32(s, addr, v, 0);
}
