#!/usr/bin/env bash
# Development machine: packs vLLM 0.33.0 (what users install today), the torch 2.14.0 it pins with
# triton 3.8.0 (torch's pin), torchvision 0.29.0 (vLLM's pin; the image's 0.26 is built for torch
# 2.11), the nvidia-* CUDA 13 libraries torch 2.14 pins (cuda-toolkit 13.0.3's set, cudnn, cusparselt,
# nccl, nvshmem: carried so the set is self-consistent, the image's versions being unknown) and
# the packages the server needs beyond the image (scripts/gpu/vllm033-carry.txt) into
# .gpucarry/vllm033-site.partNN, parts of at most 48 MiB (a call carries 64 MiB with the 5 MiB tree),
# with vllm033-site.sha256 and vllm033-site.parts (the count). On the GPU machine the site unpacks to
# /root/okv/site033 (VLLM=0.33 scripts/gpu/vllm.sh carryNN: one part a call). torch finds the
# libraries through its RPATH, $ORIGIN/../../nvidia/{cu13,cudnn,nccl,cusparselt,nvshmem}/lib: the
# wheels' own layout, which the unpacked site keeps.
#
# The wheels are unpacked by hand (this machine's Python is not 3.12), then slimmed of what Qwen3-8B
# on FLASH_ATTN with one H100 (sm_90) never loads:
#   vllm: FA2 (Hopper runs FA3), the MoE, FlashMLA, FlashKDA, DeepSelect and QuTLASS kernels, the Rust
#         frontend vllm-rs, DeepGEMM and the SM100 FMHA (every import of them is optional)
#   torch: protoc; triton: the CUPTI copies and static libraries (proton's profiler), ptxas-blackwell
#         (sm_100 and up), the instrumentation test library
#   nvidia: headers, static libraries, libnvrtc.alt, cusolverMg, cufftw, nvblas, CUPTI's perf
#         libraries (profiling only), NCCL's and NVSHMEM's device bitcode, cuDNN's sub-libraries (below)
# and every cubin not for sm_90 in the big fat binaries (.nv_fatbin) is zeroed in place
# (scripts/gpu/fatbin.py keepz: entry headers kept, xz packs the zeros to nothing; PTX entries are
# kept). These libraries compress their cubins (nvcc -Xfatbin -compress-all), so the payload of each
# compressed non-sm_90 cubin is zeroed whole; the driver decompresses only the sm_90 one it loads.
# FATBIN_MODE=keep zeroes uncompressed cubins only (about 14 parts more), KEEP_ALL_ARCH=1 nothing.
# 2026-12-05: site 4,180 MiB (6,260 unslimmed), xz 1,242 MiB: 26 parts (31 with CUDNN=full), 15 min on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${WHEELS:-$HOME/.cache/orbitkv/gpu-wheels/vllm033}
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
mkdir -p "$W/deps" .gpucarry
source scripts/gpu/wheels.sh # pipdl, unwheel
# the CUDA wheels' tags (manylinux_2_18, _2_25, 2010, ...) beyond GPU_PLATFORMS; all run on the image's glibc
more=()
for i in $(seq 5 35); do more+=(--platform "manylinux_2_${i}_x86_64"); done
more+=(--platform manylinux2010_x86_64)
pipdl "${more[@]}" -d "$W" vllm==0.33.0 torch==2.14.0 triton==3.8.0 torchvision==0.29.0 \
	nvidia-cublas==13.1.1.3 nvidia-cuda-cupti==13.0.85 nvidia-cuda-nvrtc==13.0.88 nvidia-cufft==12.0.0.61 \
	nvidia-cufile==1.15.1.6 nvidia-curand==10.4.0.35 nvidia-cusolver==12.0.4.66 nvidia-cusparse==12.6.3.3 \
	nvidia-cuda-runtime==13.0.96 nvidia-nvjitlink==13.5.37 nvidia-nvtx==13.0.85 nvidia-cudnn-cu13==9.24.0.43 \
	nvidia-cusparselt-cu13==0.8.1 nvidia-nccl-cu13==2.30.7 nvidia-nvshmem-cu13==3.4.5
grep -v '^#' scripts/gpu/vllm033-carry.txt | pipdl "${more[@]}" -d "$W/deps" -r /dev/stdin
unwheel "$SITE" "$W/deps/*.whl" "$W/nvidia_*.whl" "$W/triton-3.8.0-*.whl" "$W/torch-2.14.0-*.whl" \
	"$W/torchvision-0.29.0-*.whl" "$W/vllm-0.33.0-*.whl"
echo "site unslimmed: $(du -sm "$SITE" | cut -f1) MiB"
v=$SITE/vllm t=$SITE/triton n=$SITE/nvidia
rm -f "$v/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$v/_moe_C_stable_libtorch.abi3.so" "$v/vllm-rs" \
	"$v/_flashmla_C.abi3.so" "$v/_flashmla_extension_C.abi3.so" "$v/_flashkda_C.abi3.so" \
	"$v/_deepselect_C.abi3.so" "$v/_qutlass_C.abi3.so"
rm -rf "$v/third_party/deep_gemm" "$v/third_party/fmha_sm100"
rm -f "$SITE"/torch/bin/protoc*
rm -rf "$t/backends/nvidia/lib/cupti" "$t/backends/nvidia/lib/cupti-blackwell" "$t/instrumentation"
rm -f "$t/backends/nvidia/bin/ptxas-blackwell" "$t/_C/libproton.so"
find "$SITE/triton" "$n" -name '*.a' -delete
find "$n" -depth -type d -name include -exec rm -rf {} +
rm -f "$n"/cu13/lib/libnvrtc*.alt.so* "$n"/cu13/lib/libcusolverMg.so* "$n"/cu13/lib/libcufftw.so* \
	"$n"/cu13/lib/libnvblas.so* "$n"/cu13/lib/libnvperf_* "$n"/cu13/lib/libpcsamplingutil.so \
	"$n"/cu13/lib/libcheckpoint.so "$n"/nccl/lib/*.bc "$n"/nvshmem/lib/*.bc
# cuDNN: only its dispatcher, libcudnn.so.9, which libtorch_cuda.so needs to load; the sub-libraries
# (ops, cnn, adv, graph, engines_*, heuristic, ext: 0.9 GB) are dlopen'ed on the first cuDNN call
# (convolutions, cuDNN attention), which Qwen3-8B on FLASH_ATTN never makes. CUDNN=full keeps them
# (about 5 parts more).
[ "${CUDNN:-lean}" = full ] || rm -f "$n"/cudnn/lib/libcudnn_*.so.9
echo "site slimmed: $(du -sm "$SITE" | cut -f1) MiB"
if [ "${KEEP_ALL_ARCH:-0}" != 1 ]; then
	for so in "$SITE"/torch/lib/libtorch_cuda.so "$SITE"/torch/lib/libtorch_cuda_linalg.so \
		"$n"/cu13/lib/libcublasLt.so.13 "$n"/cu13/lib/libcublas.so.13 "$n"/cu13/lib/libcufft.so.12 \
		"$n"/cu13/lib/libcurand.so.10 "$n"/cu13/lib/libcusparse.so.12 "$n"/cu13/lib/libcusolver.so.12 \
		"$n"/cusparselt/lib/libcusparseLt.so.0 "$n"/nccl/lib/libnccl.so.2 "$n"/cudnn/lib/libcudnn_*.so.9 \
		"$n"/nvshmem/lib/libnvshmem_host.so.3 "$v"/_C_stable_libtorch.abi3.so "$v"/vllm_flash_attn/_vllm_fa3_C.abi3.so \
		"$v"/cumem_allocator.abi3.so; do
		[ -f "$so" ] || continue
		python3 scripts/gpu/fatbin.py "${FATBIN_MODE:-keepz}" "$so" 90 2>&1 | grep -E "zeroed|sm_90|ptx|no .nv_fatbin" || true
	done
	echo "site blanked: $(du -sm "$SITE" | cut -f1) MiB (blanked bytes still count here)"
fi
echo "site: $(du -sm "$SITE" | cut -f1) MiB in $(find "$SITE" -type f | wc -l) files"
rm -f .gpucarry/vllm033-site.*
tar -C "$SITE" -cf - . | xz -T2 -6 >.gpucarry/vllm033-site.tar.xz
(cd .gpucarry && sha256sum vllm033-site.tar.xz >vllm033-site.sha256 &&
	split -b 48M -d -a 2 vllm033-site.tar.xz vllm033-site.part && rm vllm033-site.tar.xz)
# vllm.sh unpacks once this many parts are under /root/okv
ls .gpucarry/vllm033-site.part[0-9][0-9] | wc -l >.gpucarry/vllm033-site.parts
ls -l .gpucarry/vllm033-site.*
echo "parts: $(cat .gpucarry/vllm033-site.parts) (one device call each: VLLM=0.33 scripts/gpu/vllm.sh carry00, carry01, ...)"
