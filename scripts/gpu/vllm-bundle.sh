#!/usr/bin/env bash
# Development machine: packs vLLM 0.26.0 and the packages the GPU machine lacks
# (scripts/gpu/vllm-carry.txt) into .gpucarry/, in parts small enough for one
# device call each (scripts/gpu/vllm.sh carry1 / carry2 move them in).
#
# The wheels are unpacked into one site directory (a --target install, done by
# hand because this machine's Python is not 3.12), vLLM is slimmed of what an
# H200 running Qwen3-8B on FLASH_ATTN never loads — FlashAttention 2 (Hopper
# runs FA3), the MoE kernels, FlashMLA, DeepGEMM, the SM100 FMHA and the Rust
# frontend (each import of them is optional in vLLM) — and the rest is xz'ed
# and split: about 100 MB in two parts.
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${WHEELS:-$HOME/.cache/orbitkv/gpu-wheels}
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
mkdir -p "$W/deps" .gpucarry
source scripts/gpu/wheels.sh # pipdl, unwheel
pipdl -d "$W" vllm==0.26.0
grep -v '^#' scripts/gpu/vllm-carry.txt | pipdl -d "$W/deps" -r /dev/stdin
unwheel "$SITE" "$W/deps/*.whl" "$W/vllm-0.26.0-*.whl"
v=$SITE/vllm
rm -f "$v/vllm_flash_attn/_vllm_fa2_C.abi3.so" "$v/_moe_C_stable_libtorch.abi3.so" "$v/vllm-rs" "$v/_flashmla_C.abi3.so"
rm -rf "$v/third_party/deep_gemm" "$v/third_party/fmha_sm100"
rm -f .gpucarry/vllm-site.*
tar -C "$SITE" -cf - . | xz -T2 -6 >.gpucarry/vllm-site.tar.xz
(cd .gpucarry && sha256sum vllm-site.tar.xz >vllm-site.sha256 && split -b 52M -d vllm-site.tar.xz vllm-site.part && rm vllm-site.tar.xz)
ls -l .gpucarry
