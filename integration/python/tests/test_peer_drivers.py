"""The peer-system drivers of `orbitkv bench tiers`: their byte check and page layout (pure),
then each driver against its real server on loopback with two small pages: Mooncake Store's
mooncake_master in each placement, LMCache's lmcache_server. Those need the systems'
environments (scripts/install-mooncake.sh, run by `make deps`; scripts/install-lmcache.sh);
without one its test skips, and ORBITKV_REQUIRE=mooncake (or lmcache) makes that a failure.
No throughput is asserted."""

import argparse
import ctypes
import json
import mmap
import os
import signal
import subprocess

import pytest

from orbitkv.bench import mooncake_driver as drv
from orbitkv.bench import pages

from orbitkv.bench import lmcache_driver

VENVS = {
    "mooncake": os.environ.get("ORBITKV_MOONCAKE_VENV", os.path.expanduser("~/.cache/orbitkv/mooncake-0.3.13.post1")),
    "lmcache": os.environ.get("ORBITKV_LMCACHE_VENV", os.path.expanduser("~/.cache/orbitkv/lmcache-0.5.6")),
}
GEOMETRY = ["--layers", "2", "--kv-heads", "1", "--head-dim", "16", "--block-tokens", "16", "--page-tokens", "64"]


def _args(pages):
    return argparse.Namespace(layers=2, kv_heads=1, head_dim=16, block_tokens=16, page_tokens=64, elem_bytes=2,
                              pages=pages)


def _buffer(lay, seed):
    mm = mmap.mmap(-1, lay.size)
    pages.fill(mm, seed)
    return mm, ctypes.addressof(ctypes.c_char.from_buffer(mm))


def test_layout_runs_cover_each_page_once():
    lay = pages.Layout(_args(3))
    assert lay.page_bytes == 2 * 2 * 4 * 16 * 1 * 16 * 2
    seen = set()
    for dest in (False, True):
        for page in range(3):
            runs = lay.runs(0, page, dest)
            assert len(runs) == 2 * lay.layers and sum(n for _, n in runs) == lay.page_bytes
            for a, n in runs:
                assert a % n == 0 and a + n <= lay.size
                seen.update(range(a, a + n, lay.block_bytes))
    assert len(seen) * lay.block_bytes == lay.size  # sources and destinations tile the buffer


def test_fill_is_the_seeds():
    lay = pages.Layout(_args(2))
    a, _ = _buffer(lay, 7)
    b, _ = _buffer(lay, 7)
    c, _ = _buffer(lay, 8)
    assert a[:] == b[:] and a[:] != c[:]


def test_check_catches_one_flipped_byte():
    lay = pages.Layout(_args(2))
    mm, base = _buffer(lay, 1)
    for page in range(2):
        for (s, n), (d, _) in zip(lay.runs(base, page, False), lay.runs(base, page, True)):
            mm[d - base:d - base + n] = mm[s - base:s - base + n]
    assert pages.check(mm, base, lay, 0) + pages.check(mm, base, lay, 1) == 2 * lay.page_bytes
    last, n = lay.runs(base, 1, True)[-1]
    mm[last - base + n - 1] ^= 1
    with pytest.raises(RuntimeError, match="page 1"):
        pages.check(mm, base, lay, 1)


def _python(system):
    venv = VENVS[system]
    if not os.path.exists(os.path.join(venv, ".orbitkv-stamp")):
        if system in os.environ.get("ORBITKV_REQUIRE", ""):
            pytest.fail(f"ORBITKV_REQUIRE={system} but {venv} is not built")
        pytest.skip(f"no {system} environment at {venv} (scripts/install-{system}.sh builds it)")
    return os.path.join(venv, "bin", "python")


def _run(py, script, *args):
    cmd = [py, script, "--pages", "2", "--batch", "1", "--rounds", "2", "--seed", "5", *GEOMETRY, *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    assert proc.returncode == 0, err[-2000:]
    res = json.loads(out)
    page_bytes = 2 * 2 * 4 * 16 * 16 * 2
    assert res["page_bytes"] == page_bytes and len(res["rounds"]) == 2
    assert res["bytes_checked"] == 2 * 2 * page_bytes
    return res


@pytest.mark.parametrize("placement", ["local", "remote"])
def test_mooncake_driver_against_a_real_master(placement):
    res = _run(_python("mooncake"), drv.__file__, "--placement", placement)
    assert res["placement"] == placement
    assert res["api"] == "batch_put_from_multi_buffers/batch_get_into_multi_buffers"


def test_lmcache_driver_against_a_real_server():
    res = _run(_python("lmcache"), lmcache_driver.__file__)
    assert res["placement"] == "server" and res["version"] == "0.5.6"
