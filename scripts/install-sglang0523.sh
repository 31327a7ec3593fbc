#!/usr/bin/env bash
# Builds the Python environment the tests against SGLang 0.5.23 run in (make test-sglang0523),
# beside the 0.5.17 one (scripts/install-sglang.sh): an overlay on the vLLM 0.33.0 environment
# (scripts/install-vllm033.sh, built first), which it sees through a .pth file, so its torch
# 2.14.0 is not installed again (SGLang 0.5.23 pins 2.14.1; its CPU-side HiCache code runs on
# 2.14.0). Its own site-packages, searched first, hold SGLang itself (--no-deps: its CUDA-only
# kernels are not needed on a CPU) and the few packages pinned in
# integration/python/requirements-sglang0523.txt.
# At first use SGLang 0.5.23 compiles its page hash (a C++ extension, into
# ~/.cache/torch_extensions): c++, ninja, Python's and OpenSSL's headers (scripts/install-deps.sh).
# Idempotent: an overlay built from the same requirements on the same base is reused. It never
# changes the vLLM environment.
set -euo pipefail
cd "$(dirname "$0")/.."

SGLANG_VERSION=0.5.23
BASE=${ORBITKV_VLLM033_VENV:-$HOME/.cache/orbitkv/vllm-0.33.0}
VENV=${ORBITKV_SGLANG0523_VENV:-$HOME/.cache/orbitkv/sglang-$SGLANG_VERSION}
REQ=integration/python/requirements-sglang0523.txt
export ORBITKV_VLLM033_VENV=$BASE
BASE_INSTALL=./scripts/install-vllm033.sh

. scripts/overlay-venv.sh
overlay_base
WANT="$(sha256sum "$REQ" | cut -d' ' -f1) sglang==$SGLANG_VERSION base=$base_site"
CHECK='import torch, grpc, pytest, sglang.srt.mem_cache.hicache_storage, sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller'
if overlay_current; then
  echo "install-sglang0523: $VENV is up to date (sglang $SGLANG_VERSION over $BASE)"
  exit 0
fi

echo "install-sglang0523: building $VENV (sglang $SGLANG_VERSION over $BASE, about 200 MB)"
overlay_new
overlay_pip -r "$REQ"
# SGLang's import warns about CUDA-only kernels on a CPU: its stderr is shown only if it fails.
got=$("$VENV/bin/python" -c "$CHECK; import sglang.version as v; print(v.__version__)" 2>"$VENV/.check.log") ||
  { cat "$VENV/.check.log"; exit 1; }
echo "install-sglang0523: sglang $got"
overlay_done
