// Gather/scatter copy kernel for package cuda (see ../kernel.go).
//
// Regenerate the committed PTX (on a machine with nvcc, from cuda/):
//   go generate ./cuda   (nvcc -ptx -arch=compute_90 -O3, then the PTX ISA
//   stamp lowered to 7.8 so that pre-13 drivers load it: see ../kernel.go)
//
// One thread block copies one chunk of one segment: blockIdx.x is the
// segment, blockIdx.y the chunk. Addresses and lengths are 16-byte aligned
// (the Go side checks), so every thread moves 16-byte vectors, four loads in
// flight before the first store. Source or destination may be mapped pinned
// host memory (cuMemHostGetDevicePointer): the loads or stores then cross
// PCIe directly, with no staging copy.

struct Seg {
	unsigned long long src;
	unsigned long long dst;
	unsigned long long len;
};

extern "C" __global__ void __launch_bounds__(1024)
orbitkv_copy_segments(const Seg *__restrict__ segs, unsigned int chunk)
{
	const Seg s = segs[blockIdx.x];
	unsigned long long start = (unsigned long long)blockIdx.y * chunk;
	if (start >= s.len) return;
	unsigned long long end = start + chunk;
	if (end > s.len) end = s.len;
	const uint4 *src = reinterpret_cast<const uint4 *>(s.src);
	uint4 *dst = reinterpret_cast<uint4 *>(s.dst);
	unsigned long long i = start / 16 + threadIdx.x;
	const unsigned long long n = end / 16;
	const unsigned long long step = blockDim.x;
	for (; i + 3 * step < n; i += 4 * step) {
		uint4 a = __ldcs(src + i);
		uint4 b = __ldcs(src + i + step);
		uint4 c = __ldcs(src + i + 2 * step);
		uint4 d = __ldcs(src + i + 3 * step);
		__stcs(dst + i, a);
		__stcs(dst + i + step, b);
		__stcs(dst + i + 2 * step, c);
		__stcs(dst + i + 3 * step, d);
	}
	for (; i < n; i += step) __stcs(dst + i, __ldcs(src + i));
}
