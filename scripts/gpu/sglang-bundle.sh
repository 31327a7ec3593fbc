#!/usr/bin/env bash
# Development machine: packs SGLang 0.5.17, its kernel package sglang-kernel 0.4.5 (the exact pin
# in 0.5.17's metadata) and the packages its server needs that neither the GPU machine's image
# nor the vLLM bundle carries (scripts/gpu/sglang-carry.txt) into .gpucarry/sglang-site.partNN,
# parts of at most 48 MiB (a call carries 64 MiB with the 5 MiB tree), one per device call (scripts/gpu/sglang.sh carry00 ... moves them in).
# On the GPU machine the site unpacks to /root/okv/sgl, searched before the vLLM site
# /root/okv/site (scripts/gpu/vllm-bundle.sh), which SGLang needs too (fastapi, uvicorn, pydantic,
# pyzmq, msgspec, ... from vllm-carry.txt).
# SGL=0.5.23: SGLang 0.5.23, the version users install, with sglang-kernel 0.4.10 and
# scripts/gpu/sglang0523-carry.txt, into .gpucarry/sglang0523-site.partNN; on the GPU machine it
# unpacks to /root/okv/sgl0523 and runs over the vLLM 0.33 site /root/okv/site033 (torch 2.14.0,
# triton 3.8.0, CUDA 13: scripts/gpu/vllm033-bundle.sh), which must be carried first
# (SGL_VERSION=0.5.23 scripts/gpu/sglang.sh).
#
# The wheels are unpacked into one site directory by hand (this machine's Python is not 3.12),
# then slimmed of what an H200 serving Qwen3-8B with FA3 never loads:
#   sgl_kernel/sm100/common_ops   load_utils._load_architecture_specific_ops() loads sm90/ when the
#                                 device's compute capability is 90 and sm100/ for every other one
#   sgl_kernel/flashmla_ops       FlashMLA (DeepSeek MLA); imported inside try/except in flash_mla.py
#   sgl_kernel/infllm_ops         InfLLM-V2 (MiniCPM); a cp310 pybind module loaded on first use only,
#                                 and one Python 3.12 could not load anyway
#   sgl_kernel/flash_ops: the sm_80 and sm_86 cubins   FA3's library carries cubins for sm_80, sm_86
#                                 and sm_90 (1.1 GB, the sm_90 ones 474 MiB). The CUDA driver loads
#                                 the cubin of the device's own arch; the others are blanked in place
#                                 (scripts/gpu/fatbin.py: headers kept, code zeroed, every sm_90 cubin
#                                 byte-identical; cuobjdump 13.5 calls a blanked entry "Invalid ELF", the
#                                 driver reads only the sm_90 one), so xz packs them to nothing.
#                                 sm90/common_ops is left whole (it is small).
#   sglang/multimodal_gen         the diffusion server (sglang generate), never imported by launch_server
# KEEP_ALL_ARCH=1 skips the blanking (about twice the parts).
set -euo pipefail
cd "$(dirname "$0")/../.."
case ${SGL:=0.5.17} in
0.5.17) KERNEL=0.4.5 NAME=sglang-site CARRY=scripts/gpu/sglang-carry.txt DIR=sglang ;;
0.5.23) KERNEL=0.4.10 NAME=sglang0523-site CARRY=scripts/gpu/sglang0523-carry.txt DIR=sglang0523 ;;
*) echo "SGL=$SGL: 0.5.17 or 0.5.23" >&2; exit 2 ;;
esac
W=${WHEELS:-$HOME/.cache/orbitkv/gpu-wheels/$DIR}
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
mkdir -p "$W/deps" .gpucarry
source scripts/gpu/wheels.sh # pipdl, unwheel
pipdl -d "$W" sglang==$SGL sglang-kernel==$KERNEL
grep -v '^#' "$CARRY" | pipdl -d "$W/deps" -r /dev/stdin
unwheel "$SITE" "$W/deps/*.whl" "$W/sglang_kernel-$KERNEL-*.whl" "$W/sglang-$SGL-cp312-*.whl"
k=$SITE/sgl_kernel
rm -rf "$k/sm100" "$SITE/sglang/multimodal_gen"
rm -f "$k/flashmla_ops.abi3.so" "$k"/infllm_ops.*.so
[ "${KEEP_ALL_ARCH:-0}" = 1 ] || python3 scripts/gpu/fatbin.py keep "$k/flash_ops.abi3.so" 90
python3 scripts/gpu/fatbin.py list "$k/sm90/common_ops.abi3.so"
echo "site: $(du -sm "$SITE" | cut -f1) MiB in $(find "$SITE" -type f | wc -l) files"
rm -f .gpucarry/$NAME.*
tar -C "$SITE" -cf - . | xz -T2 -6 >.gpucarry/$NAME.tar.xz
(cd .gpucarry && sha256sum $NAME.tar.xz >$NAME.sha256 && split -b 48M -d $NAME.tar.xz $NAME.part && rm $NAME.tar.xz)
# sglang.sh unpacks once this many parts are under /root/okv
ls .gpucarry/$NAME.part[0-9][0-9] | wc -l >.gpucarry/$NAME.parts
ls -l .gpucarry/$NAME.*
echo "parts: $(cat .gpucarry/$NAME.parts) (one device call each: SGL_VERSION=$SGL scripts/gpu/sglang.sh carry00, carry01, ...; out/orbitkv.xz with the last)"
