#!/usr/bin/env bash
# Builds the Python environment the tests against real SGLang run in (make test-sglang): an
# overlay venv on the vLLM environment (scripts/install-vllm.sh, built first), which it sees
# through a .pth file, so torch 2.11.0 is not installed twice. Its own site-packages, searched
# first, hold SGLang itself (--no-deps: its CUDA-only kernels are not needed on a CPU) and the
# few packages pinned in integration/python/requirements-sglang.txt.
# Idempotent: an overlay built from the same requirements on the same base is reused. It never
# changes the vLLM environment.
set -euo pipefail
cd "$(dirname "$0")/.."

SGLANG_VERSION=0.5.17
BASE=${ORBITKV_VLLM_VENV:-$HOME/.cache/orbitkv/vllm-0.26.0}
VENV=${ORBITKV_SGLANG_VENV:-$HOME/.cache/orbitkv/sglang-$SGLANG_VERSION}
REQ=integration/python/requirements-sglang.txt

. scripts/overlay-venv.sh
overlay_base
WANT="$(sha256sum "$REQ" | cut -d' ' -f1) sglang==$SGLANG_VERSION base=$base_site"
CHECK='import torch, grpc, pytest, sglang.srt.mem_cache.hicache_storage'
if overlay_current; then
  echo "install-sglang: $VENV is up to date (sglang $SGLANG_VERSION over $BASE)"
  exit 0
fi

echo "install-sglang: building $VENV (sglang $SGLANG_VERSION over $BASE, about 300 MB)"
overlay_new
overlay_pip -r "$REQ"
"$VENV/bin/python" -c "$CHECK; import sglang.version as v; print('install-sglang: sglang', v.__version__)"
overlay_done
