#!/usr/bin/env bash
# Builds the Python environment the tests against real vLLM run in (make test-vllm):
# torch at vLLM 0.26.0's exact pin (2.11.0, PyPI's CUDA 13 build; it runs on a CPU) and
# vLLM's runtime requirements, pinned in integration/python/requirements-vllm.txt, then
# vLLM 0.26.0 itself with --no-deps: it also pins CUDA-only packages that PyPI does not
# carry (flashinfer-cubin 0.6.14), and the CPU tests use none of its kernels.
# Idempotent: an environment built from the same requirements is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.26.0
VENV=${ORBITKV_VLLM_VENV:-$HOME/.cache/orbitkv/vllm-$VLLM_VERSION}
REQ=integration/python/requirements-vllm.txt
PY=${ORBITKV_VLLM_PYTHON:-python3}

want="$(sha256sum "$REQ" | cut -d' ' -f1) vllm==$VLLM_VERSION"
stamp="$VENV/.orbitkv-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
   "$VENV/bin/python" -c 'import torch, vllm, grpc, pytest' >/dev/null 2>&1; then
  echo "install-vllm: $VENV is up to date (vllm $VLLM_VERSION)"
  exit 0
fi

echo "install-vllm: building $VENV (torch 2.11.0 and vLLM's requirements: about 5 GB, a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "vllm==$VLLM_VERSION"
"$VENV/bin/python" -c 'import vllm; print("install-vllm: vllm", vllm.__version__)' 2>&1 | tail -1
echo "$want" >"$stamp"
