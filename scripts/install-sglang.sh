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

ORBITKV_VLLM_VENV=$BASE ./scripts/install-vllm.sh
base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
want="$(sha256sum "$REQ" | cut -d' ' -f1) sglang==$SGLANG_VERSION base=$base_site"
stamp="$VENV/.orbitkv-stamp"
check='import torch, grpc, pytest, sglang.srt.mem_cache.hicache_storage'
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "install-sglang: $VENV is up to date (sglang $SGLANG_VERSION over $BASE)"
  exit 0
fi

echo "install-sglang: building $VENV (sglang $SGLANG_VERSION over $BASE, about 300 MB)"
rm -rf "$VENV"
"$BASE/bin/python" -m venv --without-pip "$VENV"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# After this venv's own site-packages: the base's, for torch, grpc, pytest and pip.
echo "$base_site" >"$site/zz-orbitkv-vllm-base.pth"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --ignore-installed -r "$REQ"
"$VENV/bin/python" -c "$check; import sglang.version as v; print('install-sglang: sglang', v.__version__)"
echo "$want" >"$stamp"
