"""LMCache side of `orbitkv bench tiers`: the same pages, put and got through LMCache's server.

Run by the Go benchmark with the Python of LMCache's environment (scripts/install-lmcache.sh);
it imports nothing from the orbitkv package but pages.py beside it. It starts LMCache's
standalone KV server, `lmcache_server` (lmcache.v1.server, storage "cpu": the server of
LMCache's `lm://` remote backend) on a free loopback port, and moves every page the way
LMCache's client for it does (lmcache.v1.storage_backend.connector.lm_connector): the page's
2 x layers block runs gathered into one contiguous object (as LMCache's GPU connector fills a
MemoryObj), sent after a ClientMetaMessage on one TCP connection; a GET answered with a
ServerMetaMessage and the bytes, received into a buffer and scattered back into other blocks.
A PUT has no reply in this protocol, so the put timing ends with an EXIST of the last key,
which the server answers after storing every page before it. Every byte got back is compared
with the byte put, outside the timing.

LMCache's anonymous usage telemetry is switched off (LMCACHE_TRACK_USAGE=false,
DO_NOT_TRACK=1) before anything of LMCache is imported or started: the run talks to loopback
only. Prints one JSON object on stdout (the same shape as mooncake_driver.py's).
"""

import argparse
import ctypes
import json
import mmap
import os
import signal
import socket
import subprocess
import sys
import time

os.environ["LMCACHE_TRACK_USAGE"] = "false"
os.environ["DO_NOT_TRACK"] = "1"
os.environ.setdefault("LMCACHE_DISABLE_BANNER", "1")

try:
    from .pages import Layout, check, die_with_parent, fill, free_port, layout_args, wait_listening, zero_destinations
except ImportError:  # run as a script: pages.py sits beside it
    from pages import Layout, check, die_with_parent, fill, free_port, layout_args, wait_listening, zero_destinations


def start_server():
    """Starts lmcache_server on a free loopback port; returns (process, port)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "lmcache.v1.server", "127.0.0.1", str(port), "cpu"],
                            stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr,
                            preexec_fn=die_with_parent)
    try:
        wait_listening(port, proc, 120)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return proc, port


class Client:
    """One connection to lmcache_server, speaking its protocol with LMCache's own message classes."""

    def __init__(self, port, lay):
        import torch
        from lmcache.utils import CacheEngineKey
        from lmcache.v1.memory_management import MemoryFormat
        from lmcache.v1.protocol import ClientCommand, ClientMetaMessage, ServerMetaMessage, ServerReturnCode

        self.torch, self.Key, self.Fmt = torch, CacheEngineKey, MemoryFormat
        self.Cmd, self.Meta, self.Reply, self.Code = ClientCommand, ClientMetaMessage, ServerMetaMessage, ServerReturnCode
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.lay = lay
        self.shape = torch.Size([2, lay.layers, lay.per * lay.block_bytes // 2])
        self.staging = bytearray(lay.page_bytes)

    def key(self, name):
        return self.Key("orbitkv-bench", 1, 0, name, self.torch.bfloat16)

    def _send_meta(self, cmd, key, length):
        self.sock.sendall(self.Meta(cmd, key, length, self.Fmt(1), self.torch.bfloat16, self.shape).serialize())

    def _recv_into(self, view):
        got = 0
        while got < len(view):
            n = self.sock.recv_into(view[got:])
            if n == 0:
                raise RuntimeError("lmcache_server closed the connection")
            got += n

    def _reply(self):
        buf = bytearray(self.Reply.packlength())
        self._recv_into(memoryview(buf))
        return self.Reply.deserialize(bytes(buf))

    def put(self, mm, base, page, key):
        view, off = memoryview(self.staging), 0
        for a, n in self.lay.runs(base, page, False):
            view[off:off + n] = mm[a - base:a - base + n]
            off += n
        self._send_meta(self.Cmd.PUT, key, len(self.staging))
        self.sock.sendall(self.staging)

    def exists(self, key):
        self._send_meta(self.Cmd.EXIST, key, 0)
        return self._reply().code == self.Code.SUCCESS

    def get(self, mm, base, page, key):
        self._send_meta(self.Cmd.GET, key, 0)
        meta = self._reply()
        if meta.code != self.Code.SUCCESS or meta.length != len(self.staging):
            raise RuntimeError(f"lmcache get {key.to_string()}: code {meta.code}, {meta.length} bytes")
        view, off = memoryview(self.staging), 0
        self._recv_into(view)
        for a, n in self.lay.runs(base, page, True):
            mm[a - base:a - base + n] = view[off:off + n]
            off += n


def bench(a):
    lay = Layout(a)
    mm = mmap.mmap(-1, lay.size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    fill(mm, a.seed)
    server, port = start_server()
    try:
        c = Client(port, lay)
        rounds, checked = [], 0
        for r in range(a.rounds):
            zero_destinations(mm, base, lay)
            keys = [c.key(a.seed * 1_000_000 + r * 10_000 + p) for p in range(lay.pages)]
            t0 = time.perf_counter()
            for p, k in enumerate(keys):
                c.put(mm, base, p, k)
            if not c.exists(keys[-1]):
                raise RuntimeError("lmcache_server does not hold the last page put")
            put = time.perf_counter() - t0
            t0 = time.perf_counter()
            for p, k in enumerate(keys):
                c.get(mm, base, p, k)
            get = time.perf_counter() - t0
            checked += sum(check(mm, base, lay, p) for p in range(lay.pages))
            total = lay.pages * lay.page_bytes
            rounds.append({"put_gbps": total / put / 1e9, "get_gbps": total / get / 1e9})
        c.sock.close()
        import importlib.metadata as md
        json.dump({"version": md.version("lmcache"), "placement": "server", "api": "lmcache_server PUT/GET (lm:// protocol)",
                   "page_bytes": lay.page_bytes, "pages": lay.pages, "rounds": rounds, "bytes_checked": checked}, sys.stdout)
        print(flush=True)
    finally:
        server.kill()
        server.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    layout_args(p, "ignored: the protocol moves one page per message")
    p.add_argument("--placement", default="server", help="ignored: one placement, a server process")
    a = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    bench(a)


if __name__ == "__main__":
    main()
