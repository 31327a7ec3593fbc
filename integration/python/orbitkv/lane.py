"""The engine lane: the peer's engine calls as plain frames on a Unix socket
beside its gRPC one (``<socket>.lane``; the format is the peer's
internal/lane package). The same calls, answers and errors as gRPC, at a
fraction of its latency: a gRPC unary call from Python costs 0.3 ms hot
and 1-2 ms after an idle spell (an engine's first lookup for a prompt
always comes after one), a Lookup over the lane 0.06 and 0.4-0.5 ms
(python -m orbitkv.bench.rpc on the H100 host, 2026-12-06).

A call takes an idle connection or opens one (one per calling thread at a
time), and drops it after any transport error, so a late answer can never
be read as the next call's. A peer without a lane (older, or its socket
path too long) refuses the connection: ``Unreachable`` tells the client to
use gRPC for the call, and the lane is tried again RETRY_S later."""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from typing import Optional

from orbitkv import errors

SUFFIX = ".lane"
RETRY_S = 1.0
MAX_FRAME = 16 << 20
# Status codes as the peer sends them (gRPC's numbering).
_CODES = {0: "OK", 1: "CANCELLED", 2: "UNKNOWN", 3: "INVALID_ARGUMENT", 4: "DEADLINE_EXCEEDED", 5: "NOT_FOUND",
          6: "ALREADY_EXISTS", 7: "PERMISSION_DENIED", 8: "RESOURCE_EXHAUSTED", 9: "FAILED_PRECONDITION",
          10: "ABORTED", 11: "OUT_OF_RANGE", 12: "UNIMPLEMENTED", 13: "INTERNAL", 14: "UNAVAILABLE",
          15: "DATA_LOSS", 16: "UNAUTHENTICATED"}


class Unreachable(Exception):
    """The lane cannot be connected to now: make the call over gRPC."""


def enabled() -> bool:
    """ORBITKV_LANE=0 turns the lane off (every call over gRPC)."""
    return os.environ.get("ORBITKV_LANE", "1") != "0"


class Lane:
    """The connections of one client to one peer's lane."""

    def __init__(self, path: str, connect_timeout: float) -> None:
        self.path = path
        self.connect_timeout = connect_timeout
        self._lock = threading.Lock()
        self._idle: list[socket.socket] = []
        self._retry_at = 0.0  # monotonic time before which the lane is not tried again
        self._closed = False

    def call(self, action: str, method: str, body: bytes, timeout: float) -> bytes:
        """Sends one request and returns the response's bytes; a peer's
        error raises the matching OrbitKVError, a transport failure
        PeerUnavailable or PeerTimeout, a lane that cannot be reached
        Unreachable (nothing was sent)."""
        if len(body) + len(method) + 9 > MAX_FRAME:
            raise Unreachable("over the lane's frame limit")  # gRPC answers it (RESOURCE_EXHAUSTED)
        deadline = time.monotonic() + timeout
        s, reused = self._take(action, deadline)
        try:
            try:
                code, out = _roundtrip(s, method, body, deadline)
            except _NotSent:
                if not reused:
                    raise
                s.close()  # the peer closed it while idle (e.g. it restarted): nothing was sent to anyone
                s, _ = self._take(action, deadline, fresh=True)
                code, out = _roundtrip(s, method, body, deadline)
        except socket.timeout:
            s.close()
            raise errors.PeerTimeout(f"{action}: DEADLINE_EXCEEDED: no answer on the lane within {timeout:g}s",
                                     "DEADLINE_EXCEEDED") from None
        except (OSError, EOFError, ValueError) as e:
            s.close()
            raise errors.PeerUnavailable(f"{action}: UNAVAILABLE: lane: {e}", "UNAVAILABLE") from None
        self._give(s)
        if code != 0:
            name = _CODES.get(code, "UNKNOWN")
            raise errors.from_code(action, name, out.decode("utf-8", "replace"))
        return out

    def _take(self, action: str, deadline: float, fresh: bool = False) -> tuple[socket.socket, bool]:
        """An idle connection the peer has not closed, or a new one; and
        whether it was idle. A connection the peer does not accept before
        the call's deadline (it is paused, its backlog full) is a timeout."""
        while not fresh:
            with self._lock:
                if self._closed:
                    raise Unreachable("closed")
                if not self._idle:
                    break
                s = self._idle.pop()
            if not _dropped(s):
                return s, True
            s.close()
        with self._lock:
            if self._closed:
                raise Unreachable("closed")
            if time.monotonic() < self._retry_at:
                raise Unreachable("not reachable lately")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(max(0.001, min(self.connect_timeout, deadline - time.monotonic())))
        try:
            s.connect(self.path)
        except socket.timeout:
            s.close()
            raise errors.PeerTimeout(f"{action}: DEADLINE_EXCEEDED: the lane did not accept the connection in time",
                                     "DEADLINE_EXCEEDED") from None
        except OSError as e:
            s.close()
            with self._lock:
                self._retry_at = time.monotonic() + RETRY_S
            raise Unreachable(str(e)) from None
        return s, False

    def _give(self, s: socket.socket) -> None:
        with self._lock:
            if not self._closed:
                self._idle.append(s)
                return
        s.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for s in idle:
            s.close()


class _NotSent(OSError):
    """The request could not be written: the peer had closed the connection."""


def _dropped(s: socket.socket) -> bool:
    """Whether an idle connection was closed by the peer (it is readable:
    EOF, or bytes no call asked for)."""
    p = select.poll()
    p.register(s, select.POLLIN | select.POLLERR | select.POLLHUP)
    return bool(p.poll(0))


def _roundtrip(s: socket.socket, method: str, body: bytes, deadline: float) -> tuple[int, bytes]:
    name = method.encode()
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout()
    rest = struct.pack(">B", len(name)) + name + struct.pack(">I", min(max(1, int(left * 1000)), 0xFFFFFFFF)) + body
    s.settimeout(left)
    try:
        s.sendall(struct.pack(">I", len(rest)) + rest, socket.MSG_NOSIGNAL)  # EPIPE, not SIGPIPE
    except (BrokenPipeError, ConnectionResetError) as e:
        raise _NotSent(str(e)) from None
    buf = bytearray()
    _recv_more(s, buf, deadline)  # most answers come in one read
    while len(buf) < 4:
        _recv_more(s, buf, deadline)
    (n,) = struct.unpack_from(">I", buf)
    if n < 1 or n > MAX_FRAME:
        raise ValueError(f"answer of {n} bytes")
    while len(buf) < 4 + n:
        _recv_more(s, buf, deadline)
    if len(buf) > 4 + n:
        raise ValueError(f"{len(buf) - 4 - n} bytes after the answer")
    return buf[4], bytes(buf[5:])


def _recv_more(s: socket.socket, buf: bytearray, deadline: float) -> None:
    left = deadline - time.monotonic()
    if left <= 0:
        raise socket.timeout()
    s.settimeout(left)
    chunk = s.recv(1 << 16)
    if not chunk:
        raise EOFError("the peer closed the lane")
    buf += chunk
