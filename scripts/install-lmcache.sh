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

. scripts/overlay-venv.sh
overlay_base
WANT="$(sha256sum "$REQ" | cut -d' ' -f1) lmcache==$LMCACHE_VERSION base=$base_site"
CHECK='import lmcache.v1.server.__main__, lmcache.v1.protocol'
if overlay_current; then
  echo "install-lmcache: $VENV is up to date (lmcache $LMCACHE_VERSION over $BASE)"
  exit 0
fi

echo "install-lmcache: building $VENV (lmcache $LMCACHE_VERSION over $BASE, an 18 MB wheel)"
overlay_new
overlay_pip -r "$REQ"
overlay_done
echo "install-lmcache: done"
