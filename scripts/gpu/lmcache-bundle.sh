#!/usr/bin/env bash
# Development machine: packs LMCache 0.5.6 (the newest on PyPI, built for CUDA 13) and the
# packages it needs beyond vLLM's bundle (scripts/gpu/vllm-bundle.sh) into
# .gpucarry/lmcache-site.tar.xz, for vllm.sh's lmcache config (one device call carries it,
# about 20 MB). LMCache's compiled ops link to libtorch and libcudart.so.13; whether they load
# under the GPU machine's torch 2.11 is what the run finds out (vllm.sh logs the import).
set -euo pipefail
cd "$(dirname "$0")/../.."
W=${WHEELS:-$HOME/.cache/orbitkv/gpu-wheels}/lmcache
SITE=$(mktemp -d)
trap 'rm -rf "$SITE"' EXIT
mkdir -p "$W" .gpucarry
source scripts/gpu/wheels.sh # pipdl, unwheel
pipdl -d "$W" lmcache==0.5.6 aiofile==3.9.0 caio==0.9.24 aiofiles==24.1.0 nvtx==0.2.14 sortedcontainers==2.4.0 \
	py-cpuinfo==9.0.0 redis==6.4.0
unwheel "$SITE" "$W/*.whl"
tar -C "$SITE" -cf - . | xz -T2 -6 >.gpucarry/lmcache-site.tar.xz
ls -l .gpucarry/lmcache-site.tar.xz
