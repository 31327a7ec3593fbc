"""Peer fixtures: the in-process fake, and the real Go binary from
ORBITKV_BIN (started in a temp dir, its log in DIR/peer.log, waited for its
"serving" log line, killed at teardown). Both can be restarted
(``PeerHandle.restart``). Real-peer tests skip only when ORBITKV_BIN is
unset or missing."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
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
    data_dir: str = ""
    args: tuple = ()  # the real peer's command line
    log_path: str = ""  # the real peer's stderr (JSON log lines), appended across restarts

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

    def stop(self, sig: int = signal.SIGKILL) -> None:
        """Stops the real peer with ``sig`` and reaps it (bounded)."""
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def restart(self, sig: int = signal.SIGKILL) -> None:
        """Restarts the peer on the same socket (and, for the real one, the
        same data dir and flags): every session, lease and operation is
        forgotten; the fake keeps its store, the real one its SSD pages."""
        if self.fake is not None:
            self.fake.restart()
            return
        self.stop(sig)
        self.start()

    def start(self) -> None:
        """(Re)starts the real peer with its recorded command line."""
        assert self.kind == "real" and self.args
        self.proc, rec = _spawn_until_serving(list(self.args), self.log_path)
        self.socket = rec.get("socket", self.socket)
        self.metrics_addr = rec.get("metrics", "")


def real_peer_bin() -> Optional[str]:
    b = os.environ.get("ORBITKV_BIN", "")
    return b if b and os.path.isfile(b) and os.access(b, os.X_OK) else None


def start_real_peer(tmp: str, *extra: str) -> PeerHandle:
    """Starts ``orbitkv serve`` with tmp as its data dir (socket, catalog,
    SSD files, log); skips when ORBITKV_BIN is unset or missing."""
    h = real_peer_handle(tmp, *extra)
    h.start()
    return h


def real_peer_handle(tmp: str, *extra: str) -> PeerHandle:
    """The handle start_real_peer would return, not started yet (``start()``
    starts it); skips when ORBITKV_BIN is unset or missing."""
    binary = real_peer_bin()
    if binary is None:
        pytest.skip(f"real peer: ORBITKV_BIN is unset or not an executable file ({os.environ.get('ORBITKV_BIN', '')!r})")
    sock = os.path.join(tmp, "orbitkv.sock")
    args = (binary, "serve", "--data-dir", tmp, "--socket", sock, "--dram-bytes", "64MiB",
            "--ssd-bytes", "256MiB", "--metrics-addr", "127.0.0.1:0", *extra)
    return PeerHandle("real", sock, data_dir=tmp, args=args, log_path=os.path.join(tmp, "peer.log"))


def _spawn_until_serving(args: list[str], log_path: str) -> tuple[subprocess.Popen, dict]:
    """Starts the peer with stderr appended to log_path and waits (bounded)
    for its "serving" line; returns the process and that log record."""
    with open(log_path, "ab") as log:
        offset = log.tell()
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + SERVE_DEADLINE_S
    with open(log_path, "rb") as f:
        f.seek(offset)
        buf = b""
        while time.monotonic() < deadline:
            chunk = f.read()
            buf += chunk
            *lines, buf = buf.split(b"\n")
            for line in lines:
                try:
                    rec = json.loads(line)
                except ValueError:
                    continue
                if rec.get("message") == "serving":
                    return proc, rec
            if proc.poll() is not None:
                raise RuntimeError(f"orbitkv serve exited {proc.returncode}: {_tail(log_path, offset)}")
            if not chunk:
                time.sleep(0.02)
    proc.kill()
    proc.wait()
    raise RuntimeError(f"orbitkv serve: no 'serving' line within {SERVE_DEADLINE_S}s: {_tail(log_path, offset)}")


def _tail(path: str, offset: int, n: int = 2000) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read().decode(errors="replace")[-n:]


def stop_real_peer(h: PeerHandle) -> None:
    h.stop()


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
# --- the reference engine as a separate process ---------------------------------------------

ENGINE_START_DEADLINE_S = 90.0
PYTHON_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass
class EngineProc:
    """``python3 -m orbitkv.refengine`` serving on 127.0.0.1:port; its
    stderr (the connector's log) in log_path."""

    proc: subprocess.Popen
    url: str
    log_path: str

    def post(self, path: str, body: dict, timeout: float = 60.0) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def complete(self, prompt: list[int], max_tokens: int, timeout: float = 60.0) -> dict:
        """A non-streaming completion that must succeed: the response body."""
        code, out = self.post("/v1/completions", {"prompt": prompt, "max_tokens": max_tokens}, timeout)
        assert code == 200, (code, out, self.log_tail())
        return out

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=5) as r:
            text = r.read().decode()
        return {l.split()[0]: float(l.split()[1]) for l in text.splitlines() if l and not l.startswith("#")}

    def shm_files(self) -> list[str]:
        return glob.glob(f"/dev/shm/orbitkv-refengine-{self.proc.pid}-*")

    def log_tail(self, n: int = 3000) -> str:
        with open(self.log_path, "rb") as f:
            return f.read().decode(errors="replace")[-n:]

    def stop(self, timeout: float = 30.0) -> Optional[int]:
        """SIGTERM (the engine removes its /dev/shm pool), SIGKILL after
        ``timeout``; leftover pool files of a killed engine are removed.
        Returns the exit code of a process that was still running."""
        if self.proc.poll() is not None:
            rc = None
        else:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                rc = self.proc.wait(10)
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        for f in self.shm_files():
            os.unlink(f)
        return rc


def start_refengine(tmp: str, name: str, *args: str) -> EngineProc:
    """Starts the tiny reference engine with ``args`` appended and waits
    (bounded) for its "listening" line."""
    log_path = os.path.join(tmp, f"{name}.log")
    env = dict(os.environ, PYTHONPATH=PYTHON_ROOT)
    cmd = [sys.executable, "-m", "orbitkv.refengine", "--preset", "tiny", "--port", "0", *args]
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=log, env=env)
    eng = EngineProc(proc, "", log_path)
    deadline = time.monotonic() + ENGINE_START_DEADLINE_S
    prefix = "refengine listening on "
    out, text = b"", ""
    # Libraries may print to stdout first (Triton's INFO lines in a vLLM
    # venv): the engine's own line is the one that starts with prefix.
    while not text and time.monotonic() < deadline and proc.poll() is None:
        r, _, _ = select.select([proc.stdout], [], [], 0.2)
        if r:
            out += os.read(proc.stdout.fileno(), 4096)
            lines = out.decode(errors="replace").split("\n")[:-1]  # complete lines only
            text = next((ln.strip() for ln in lines if ln.strip().startswith(prefix)), "")
    if not text:
        eng.stop()
        raise RuntimeError(f"refengine {name} did not start within {ENGINE_START_DEADLINE_S}s ({out.decode(errors='replace')!r}): {eng.log_tail()}")
    eng.url = text[len(prefix):].split()[0]
    return eng


def wait_until(pred, timeout: float, what: str, interval: float = 0.05):
    """Polls pred() until it returns a truthy value (returned) or the
    deadline passes (AssertionError naming ``what``)."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(interval)
