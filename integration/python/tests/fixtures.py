"""Peer fixtures: the in-process fake, and the real Go binary from
ORBITKV_BIN (started in a temp dir, waited for its "serving" log line,
killed at teardown). Real-peer tests skip only when ORBITKV_BIN is unset or
missing."""

from __future__ import annotations

import dataclasses
import json
import os
import select
import subprocess
import tempfile
import time
import urllib.request
from typing import Optional

import pytest

from tests.fakepeer import FakePeer

SERVE_DEADLINE_S = 30.0


@dataclasses.dataclass
class PeerHandle:
    kind: str  # "fake" | "real"
    socket: str
    metrics_addr: str = ""
    fake: Optional[FakePeer] = None
    proc: Optional[subprocess.Popen] = None

    def metrics(self) -> dict[str, float]:
        """Prometheus samples of the real peer: {"name{labels}": value}."""
        if not self.metrics_addr:
            return {}
        with urllib.request.urlopen(f"http://{self.metrics_addr}/metrics", timeout=5) as r:
            text = r.read().decode()
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, val = line.rpartition(" ")
                try:
                    out[name] = float(val)
                except ValueError:
                    pass
        return out


def real_peer_bin() -> Optional[str]:
    b = os.environ.get("ORBITKV_BIN", "")
    return b if b and os.path.isfile(b) and os.access(b, os.X_OK) else None


def start_real_peer(tmp: str, *extra: str) -> PeerHandle:
    binary = real_peer_bin()
    if binary is None:
        pytest.skip(f"real peer: ORBITKV_BIN is unset or not an executable file ({os.environ.get('ORBITKV_BIN', '')!r})")
    sock = os.path.join(tmp, "orbitkv.sock")
    args = [binary, "serve", "--data-dir", tmp, "--socket", sock, "--dram-bytes", "64MiB",
            "--ssd-bytes", "256MiB", "--metrics-addr", "127.0.0.1:0", *extra]
    proc = subprocess.Popen(args, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL)
    deadline = time.monotonic() + SERVE_DEADLINE_S
    buf, seen = b"", []
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"orbitkv serve exited {proc.returncode}: {b''.join(seen + [buf]).decode(errors='replace')[-2000:]}")
        r, _, _ = select.select([proc.stderr], [], [], 0.2)
        if not r:
            continue
        chunk = os.read(proc.stderr.fileno(), 65536)
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            seen.append(line + b"\n")
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if rec.get("message") == "serving":
                _drain_stderr(proc)
                return PeerHandle("real", rec.get("socket", sock), rec.get("metrics", ""), proc=proc)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"orbitkv serve: no 'serving' line within {SERVE_DEADLINE_S}s: {b''.join(seen).decode(errors='replace')[-2000:]}")


def _drain_stderr(proc: subprocess.Popen) -> None:
    import threading

    def run():
        for _ in iter(lambda: proc.stderr.read(65536), b""):
            pass

    threading.Thread(target=run, daemon=True).start()


def stop_real_peer(h: PeerHandle) -> None:
    if h.proc is not None and h.proc.poll() is None:
        h.proc.kill()
        h.proc.wait(timeout=10)


@pytest.fixture
def tmpdir_short():
    # Unix socket paths must stay under ~108 bytes.
    with tempfile.TemporaryDirectory(prefix="okv-") as d:
        yield d


@pytest.fixture
def fake_peer(tmpdir_short):
    fp = FakePeer(os.path.join(tmpdir_short, "fake.sock"))
    yield PeerHandle("fake", fp.socket, fake=fp)
    fp.stop()


@pytest.fixture
def real_peer(tmpdir_short):
    h = start_real_peer(tmpdir_short)
    yield h
    stop_real_peer(h)


@pytest.fixture(params=["fake", "real"])
def peer(request, tmpdir_short):
    if request.param == "fake":
        fp = FakePeer(os.path.join(tmpdir_short, "fake.sock"))
        yield PeerHandle("fake", fp.socket, fake=fp)
        fp.stop()
    else:
        h = start_real_peer(tmpdir_short)
        yield h
        stop_real_peer(h)
