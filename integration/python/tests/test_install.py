"""The package installs as a user installs it: ``pip install ./integration/python``
(and the wheel ``make wheel`` builds) into a virtual environment, offline, with
its console scripts; the installed package works from any directory, and its
``orbitkv-keys`` computes the same page keys as ``orbitkv catalog lookup``."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
ROOT = os.path.dirname(os.path.dirname(PKG))
SCRIPTS = ["orbitkv-refengine", "orbitkv-refengine-bench", "orbitkv-refengine-ttft", "orbitkv-keys"]
LAYOUT = {"model": "Qwen/Qwen3-8B", "revision": "main", "dtype": "bf16", "num_layers": 36, "kv_heads": 8,
          "head_dim": 128, "tp_rank": 1, "tp_size": 2, "page_tokens": 16, "byte_layout": "vllm-flash"}
TOKENS = ",".join(str((i * 7919 + 13) % 151936) for i in range(50))


def run(*args, cwd=None, **kw):
    r = subprocess.run(list(args), cwd=cwd, capture_output=True, text=True, timeout=300, **kw)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout}\n{r.stderr}"
    return r.stdout


def venv(tmp_path, name):
    """A virtual environment that sees this interpreter's packages (grpc,
    protobuf, setuptools) so that pip needs no index."""
    d = tmp_path / name
    run(sys.executable, "-m", "venv", "--system-site-packages", str(d))
    return d


def check_installed(env, elsewhere):
    """The installed package, not the source tree, answers from elsewhere."""
    py = str(env / "bin" / "python")
    where = run(py, "-c", "import orbitkv, orbitkv.keys, orbitkv.client, orbitkv._proto.engine_pb2; print(orbitkv.__file__)",
                cwd=elsewhere, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert where.strip().startswith(str(env)), f"imported {where.strip()}, not the installed copy"
    for s in SCRIPTS:
        assert os.access(env / "bin" / s, os.X_OK), f"console script {s} not installed"
    run(str(env / "bin" / "orbitkv-refengine"), "--help", cwd=elsewhere)
    keys = run(str(env / "bin" / "orbitkv-keys"), "--layout", json.dumps(LAYOUT), "--tokens", TOKENS, cwd=elsewhere)
    from orbitkv import keys as k
    want = [x.hex() for x in k.chain(k.Layout.from_dict(LAYOUT).fingerprint(), 16, [int(t) for t in TOKENS.split(",")])]
    assert keys.split() == want
    return keys


def source_copy(tmp_path):
    """integration/python as a clone has it: pip builds in the tree it is
    given, so the test gives it a copy and leaves no build/ in the repo."""
    dst = tmp_path / "src" / "python"
    shutil.copytree(PKG, dst, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".pytest_cache"))
    return str(dst)


def test_pip_install_dir(tmp_path):
    env = venv(tmp_path, "venv")
    run(str(env / "bin" / "pip"), "install", "--no-index", "--no-build-isolation", "--no-deps", source_copy(tmp_path))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    keys = check_installed(env, elsewhere)
    binary = os.environ.get("ORBITKV_BIN")
    if binary:  # the Go CLI and the installed Python package compute one chain
        go = run(binary, "catalog", "lookup", "--layout", json.dumps(LAYOUT), "--tokens", TOKENS, "--keys-only")
        assert go == keys


def test_make_wheel(tmp_path):
    if not shutil.which("make"):
        pytest.fail("make is not installed")
    dist = tmp_path / "dist"
    run("make", "-s", "-C", ROOT, "wheel", f"DIST={dist}", f"PYTHON={sys.executable}")
    wheels = list(dist.glob("orbitkv-*.whl"))
    assert len(wheels) == 1, wheels
    with zipfile.ZipFile(wheels[0]) as z:
        names = z.namelist()
        assert "orbitkv/keys.py" in names and "orbitkv/_proto/engine_pb2.py" in names
        assert not [n for n in names if n.startswith("tests/")]
        eps = z.read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    for s in SCRIPTS:
        assert s + " = " in eps
    env = venv(tmp_path, "venv")
    run(str(env / "bin" / "pip"), "install", "--no-index", "--no-deps", str(wheels[0]))
    check_installed(env, tmp_path)
