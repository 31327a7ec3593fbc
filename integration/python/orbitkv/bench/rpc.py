"""Round trip of an engine call from Python, side by side in one run: the peer's Lookup
(128 keys, with a lease: what vLLM's scheduler asks for an 8K prompt) and Keepalive over
gRPC and over the engine lane (orbitkv.lane), beside the baseline, a bare Unix-socket echo
of the lookup's size (a Python client, a Go server that answers at once, `orbitkv bench
echo`).

    python -m orbitkv.bench.rpc --peer-bin out/orbitkv [--calls 200] [--gaps 0,0.005,0.02,0.1]

Each gap is the idle time before every call (an engine's lookup comes after the step that
scheduled the previous request: tens of ms); prints the median and p90 in microseconds."""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time

from orbitkv import keys
from orbitkv._proto import engine_pb2
from orbitkv.client import Client

SERVE_DEADLINE_S = 60
LAYOUT = keys.Layout("Qwen/Qwen3-8B", "bench", "bf16", 36, 8, 128, 0, 1, 64, "vllm-flash")


def _wait_socket(path: str, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + SERVE_DEADLINE_S
    while not os.path.exists(path):
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"{path} did not appear (exit {proc.poll()})")
        time.sleep(0.05)


def _timed(fn, calls: int, gap: float) -> list[float]:
    out = []
    for _ in range(calls):
        if gap:
            time.sleep(gap)
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return out


def _echo(path: str, size: int):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(path)
    msg = os.urandom(size)

    def call():
        s.sendall(msg)
        got = 0
        while got < size:
            chunk = s.recv(1 << 16)
            if not chunk:
                raise SystemExit("the echo server closed the connection")
            got += len(chunk)
    return call, s


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-bin", required=True)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--gaps", default="0,0.005,0.02,0.1")
    a = ap.parse_args(argv)
    gaps = [float(g) for g in a.gaps.split(",")]
    with tempfile.TemporaryDirectory(prefix="okv-rpc-") as tmp:
        sock, echo = os.path.join(tmp, "s"), os.path.join(tmp, "echo")
        peer = subprocess.Popen([a.peer_bin, "serve", "--data-dir", tmp, "--socket", sock, "--dram-bytes", "64MiB",
                                 "--ssd-bytes", "0", "--metrics-addr", ""], stderr=subprocess.DEVNULL)
        srv = subprocess.Popen([a.peer_bin, "bench", "echo", "--socket", echo])
        try:
            _wait_socket(sock + ".lane", peer)
            _wait_socket(echo, srv)
            return _run(sock, echo, a.calls, gaps)
        finally:
            for p in (peer, srv):
                p.terminate()
                p.wait(30)


def _run(sock: str, echo: str, calls: int, gaps: list[float]) -> int:
    ks = [os.urandom(16) for _ in range(128)]
    clients = {"grpc": Client(sock, use_lane=False), "lane": Client(sock, use_lane=True)}
    sessions = {k: c.open_lookup_session(LAYOUT, block_tokens=64) for k, c in clients.items()}
    echo_call, echo_sock = _echo(echo, 16 * 128 + 64)
    rows = [("echo (baseline)", echo_call)]
    for k in ("grpc", "lane"):
        s = sessions[k]
        rows.append((f"lookup {k}", lambda s=s: s.lookup(ks, lease=True)))
        rows.append((f"keepalive {k}", lambda c=clients[k], s=s: c.call(
            "keepalive", "Keepalive", engine_pb2.KeepaliveRequest(session_id=s.id))))
    print(f"{'call':<18}" + "".join(f"{'gap ' + format(g * 1000, 'g') + ' ms':>22}" for g in gaps))
    print(f"{'':<18}" + "".join(f"{'p50 / p90 us':>22}" for _ in gaps))
    for name, fn in rows:
        cells = []
        for g in gaps:
            fn()  # a connection, warm
            t = sorted(_timed(fn, calls, g))
            cells.append(f"{statistics.median(t):>12.0f} / {t[int(len(t) * 0.9)]:<7.0f}")
        print(f"{name:<18}" + "".join(f"{c:>22}" for c in cells))
    print("lookup: 128 keys the peer does not hold (no lease is made); echo: one bare round trip of its size")
    echo_sock.close()
    for c in clients.values():
        c.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
