#!/usr/bin/env bash
# Development machine: packs SGLang 0.5.17, its kernel package sglang-kernel 0.4.5 (the exact pin
# in 0.5.17's metadata) and the packages its server needs that neither the GPU machine's image
# nor the vLLM bundle carries (scripts/gpu/sglang-carry.txt) into .gpucarry/sglang-site.partNN,
# parts of at most 48 MiB (a call carries 64 MiB with the 5 MiB tree), one per device call (scripts/gpu/sglang.sh carry00 ... moves them in).
# On the GPU machine the site unpacks to /root/okv/sgl, searched before the vLLM site
# /root/okv/site (scripts/gpu/vllm-bundle.sh), which SGLang needs too (fastapi, uvicorn, pydantic,
# pyzmq, msgspec, ... from vllm-carry.txt).
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
#                                 byte-identical, cuobjdump still lists all 1116), so xz packs them
#                                 to nothing. sm90/common_ops is left whole (it is small).
#   sglang/multimodal_gen         the diffusion server (sglang generate), never imported by launch_server
# KEEP_ALL_ARCH=1 skips the blanking (about twice the parts).
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${WHEELS:-$HOME/.cache/orbitkv/gpu-wheels/sglang}
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
mkdir -p "$W/deps" .gpucarry
source scripts/gpu/wheels.sh # pipdl, unwheel
pipdl -d "$W" sglang==0.5.17 sglang-kernel==0.4.5
grep -v '^#' scripts/gpu/sglang-carry.txt | pipdl -d "$W/deps" -r /dev/stdin
unwheel "$SITE" "$W/deps/*.whl" "$W/sglang_kernel-0.4.5-*.whl" "$W/sglang-0.5.17-cp312-*.whl"
k=$SITE/sgl_kernel
rm -rf "$k/sm100" "$SITE/sglang/multimodal_gen"
rm -f "$k/flashmla_ops.abi3.so" "$k"/infllm_ops.*.so
[ "${KEEP_ALL_ARCH:-0}" = 1 ] || python3 scripts/gpu/fatbin.py keep "$k/flash_ops.abi3.so" 90
python3 scripts/gpu/fatbin.py list "$k/sm90/common_ops.abi3.so"
echo "site: $(du -sm "$SITE" | cut -f1) MiB in $(find "$SITE" -type f | wc -l) files"
rm -f .gpucarry/sglang-site.*
tar -C "$SITE" -cf - . | xz -T2 -6 >.gpucarry/sglang-site.tar.xz
(cd .gpucarry && sha256sum sglang-site.tar.xz >sglang-site.sha256 && split -b 48M -d sglang-site.tar.xz sglang-site.part && rm sglang-site.tar.xz)
# sglang.sh unpacks once this many parts are under /root/okv
ls .gpucarry/sglang-site.part[0-9][0-9] | wc -l >.gpucarry/sglang-site.parts
ls -l .gpucarry/sglang-site.*
echo "parts: $(cat .gpucarry/sglang-site.parts) (one device call each: scripts/gpu/sglang.sh carry00, carry01, ...; out/orbitkv.xz with the last)"
