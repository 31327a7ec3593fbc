#!/usr/bin/env bash
# Builds the environment bench tiers runs LMCache's server (lmcache_server) in: an overlay
# venv on the vLLM environment (scripts/install-vllm.sh, built first), seen through a .pth
# file, so torch is not installed twice. Its own site-packages hold lmcache itself
# (--no-deps: its CUDA-only requirements are not needed by the CPU server) and the one
# package the vLLM environment lacks, pinned in integration/python/requirements-lmcache.txt.
# Idempotent: an overlay built from the same requirements on the same base is reused. It
# never changes the vLLM environment. LMCache's usage telemetry is off whenever
# this project runs it (LMCACHE_TRACK_USAGE=false, DO_NOT_TRACK=1: the drivers set them).
set -euo pipefail
cd "$(dirname "$0")/.."

LMCACHE_VERSION=0.5.6
BASE=${ORBITKV_VLLM_VENV:-$HOME/.cache/orbitkv/vllm-0.26.0}
VENV=${ORBITKV_LMCACHE_VENV:-$HOME/.cache/orbitkv/lmcache-$LMCACHE_VERSION}
REQ=integration/python/requirements-lmcache.txt
export LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1 LMCACHE_DISABLE_BANNER=1

ORBITKV_VLLM_VENV=$BASE ./scripts/install-vllm.sh
base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
want="$(sha256sum "$REQ" | cut -d' ' -f1) lmcache==$LMCACHE_VERSION base=$base_site"
stamp="$VENV/.orbitkv-stamp"
check='import lmcache.v1.server.__main__, lmcache.v1.protocol'
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && "$VENV/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "install-lmcache: $VENV is up to date (lmcache $LMCACHE_VERSION over $BASE)"
  exit 0
fi

echo "install-lmcache: building $VENV (lmcache $LMCACHE_VERSION over $BASE, an 18 MB wheel)"
rm -rf "$VENV"
"$BASE/bin/python" -m venv --without-pip "$VENV"
site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# After this venv's own site-packages: the base's, for torch, numpy, msgspec and pip.
echo "$base_site" >"$site/zz-orbitkv-vllm-base.pth"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --ignore-installed -r "$REQ"
"$VENV/bin/python" -c "$check" >/dev/null
echo "$want" >"$stamp"
echo "install-lmcache: done"
