#!/usr/bin/env bash
# Builds the environment bench tiers runs Mooncake Store in (its side-by-side peer system):
# Mooncake's CPU/TCP wheel and its requirements, pinned in
# integration/python/requirements-mooncake.txt, in a virtual environment of its own (never
# the system Python). Its Debian runtime libraries (libcurl4, libibverbs1, libnuma1) come
# from scripts/install-deps.sh. Idempotent: an environment built from the same requirements
# is reused.
set -euo pipefail
cd "$(dirname "$0")/.."

MOONCAKE_VERSION=0.3.13.post1
VENV=${ORBITKV_MOONCAKE_VENV:-$HOME/.cache/orbitkv/mooncake-$MOONCAKE_VERSION}
REQ=integration/python/requirements-mooncake.txt
PY=${ORBITKV_MOONCAKE_PYTHON:-/usr/bin/python3}

want="$(sha256sum "$REQ" | cut -d' ' -f1) mooncake==$MOONCAKE_VERSION"
stamp="$VENV/.orbitkv-stamp"
check='from mooncake.store import MooncakeDistributedStore'
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] &&
   [ -x "$VENV/bin/mooncake_master" ] && "$VENV/bin/python" -c "$check" >/dev/null 2>&1; then
  echo "install-mooncake: $VENV is up to date (mooncake $MOONCAKE_VERSION)"
  exit 0
fi

echo "install-mooncake: building $VENV (mooncake-transfer-engine-non-cuda $MOONCAKE_VERSION: a 46 MB wheel)"
rm -rf "$VENV"
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --disable-pip-version-check -r "$REQ"
"$VENV/bin/python" -c "$check"
echo "$want" >"$stamp"
echo "install-mooncake: done"
