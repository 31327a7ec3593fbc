#!/usr/bin/env bash
# Builds the Python environment the connector's tests run in against vLLM 0.33.0
# (make test-vllm033), beside the 0.26.0 one (scripts/install-vllm.sh): every package
# `pip install vllm==0.33.0` resolves from PyPI (torch 2.14.0 among them), pinned in
# integration/python/requirements-vllm033.txt and installed with --no-deps (the NVIDIA CUDA
# wheels included: torch 2.14 does not import without them, even on a CPU), then vLLM
# 0.33.0 itself with --no-deps.
# Idempotent: an environment built from the same requirements is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.33.0
VENV=${ORBITKV_VLLM033_VENV:-$HOME/.cache/orbitkv/vllm-$VLLM_VERSION}
REQ=integration/python/requirements-vllm033.txt
PY=${ORBITKV_VLLM_PYTHON:-python3}

want="$(sha256sum "$REQ" | cut -d' ' -f1) vllm==$VLLM_VERSION"
stamp="$VENV/.orbitkv-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
   "$VENV/bin/python" -c 'import torch, vllm, grpc, pytest' >/dev/null 2>&1; then
  echo "install-vllm033: $VENV is up to date (vllm $VLLM_VERSION)"
  exit 0
fi

echo "install-vllm033: building $VENV (torch 2.14.0 and vLLM's requirements: about 9 GB, a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "vllm==$VLLM_VERSION"
"$VENV/bin/python" -c 'import torch, vllm; print("install-vllm033: vllm", vllm.__version__, "torch", torch.__version__)' 2>&1 | tail -1
echo "$want" >"$stamp"
