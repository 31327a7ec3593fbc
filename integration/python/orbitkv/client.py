"""Client of the peer's EngineService over its Unix socket.

Every call carries a gRPC deadline; errors become orbitkv.errors exceptions.
A Session owns a keepalive thread that stops when the session closes.
Save and Load return Op handles: the copy runs in the peer; ``Op.wait``
polls its per-page results until done or until the caller's timeout.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from typing import Iterable, Optional, Sequence

import grpc

from orbitkv import errors
from orbitkv._proto import engine_pb2, engine_pb2_grpc
from orbitkv.buffers import Buffer, Segment, ShmBuffer
from orbitkv.keys import Layout

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
_MAX_WAIT_SLICE_MS = 1000


class PageCode(enum.IntEnum):
    PENDING = 0
    OK = 1
    NOT_FOUND = 2
    CORRUPT = 3
    NO_SPACE = 4
    DEADLINE = 5
    IO_ERROR = 6
    CANCELLED = 7


class Tier(enum.IntEnum):
    UNSPECIFIED = 0
    DRAM = 1
    SSD = 2
    REMOTE = 3


class Durability(enum.IntEnum):
    DRAM = 1
    SSD = 2


@dataclasses.dataclass(frozen=True)
class PageRef:
    """One page and the engine blocks holding it, in sequence order."""

    key: bytes
    blocks: tuple[int, ...]

    def to_proto(self) -> engine_pb2.PageRef:
        return engine_pb2.PageRef(key=self.key, blocks=list(self.blocks))


@dataclasses.dataclass(frozen=True)
class LookupResult:
    hit_pages: int
    dram: int = 0
    ssd: int = 0
    remote: int = 0
    lease_id: str = ""
    lease_expires_unix_ms: int = 0


@dataclasses.dataclass(frozen=True)
class PageResult:
    code: PageCode
    tier: Tier = Tier.UNSPECIFIED
    message: str = ""

    @property
    def ok(self) -> bool:
        return self.code == PageCode.OK


@dataclasses.dataclass(frozen=True)
class OpResult:
    op_id: str
    done: bool
    pages: tuple[PageResult, ...]

    @property
    def ok(self) -> bool:
        return self.done and all(p.ok for p in self.pages)

    def failed_indices(self) -> list[int]:
        """Indices of pages that did not end OK (pending counts as failed)."""
        return [i for i, p in enumerate(self.pages) if not p.ok]


@dataclasses.dataclass(frozen=True)
class SessionInfo:
    session_id: str
    fingerprint: bytes
    page_bytes: int
    keepalive_ms: int


class Client:
    """A connection to one peer. ``timeout`` (seconds) bounds every call."""

    def __init__(self, socket_path: str, *, timeout: float = DEFAULT_TIMEOUT_S, connect_timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = grpc.insecure_channel("unix:" + socket_path)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise errors.PeerUnavailable(f"connect {socket_path}: not ready within {connect_timeout}s", "UNAVAILABLE")
        self.stub = engine_pb2_grpc.EngineServiceStub(self._channel)
        self._sessions: list[Session] = []
        self._lock = threading.Lock()
        self._closed = False

    def call(self, action: str, method: str, request, timeout: Optional[float] = None):
        """Invokes one RPC with a deadline, mapping errors."""
        try:
            return getattr(self.stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            raise errors.from_rpc_error(action, e) from None

    def open_session(
        self,
        layout: Layout,
        *,
        block_tokens: int,
        num_blocks: int,
        buffers: Sequence[Buffer],
        segments: Sequence[Segment],
        engine_id: str = "python",
        keepalive_ms: int = 0,
    ) -> "Session":
        req = engine_pb2.OpenSessionRequest(
            engine_id=engine_id,
            layout=layout.to_proto(),
            block_tokens=block_tokens,
            num_blocks=num_blocks,
            buffers=[b.to_proto() for b in buffers],
            segments=[s.to_proto() for s in segments],
            keepalive_ms=keepalive_ms,
        )
        resp = self.call("open session", "OpenSession", req)
        info = SessionInfo(resp.session_id, bytes(resp.layout_fingerprint), resp.page_bytes, resp.keepalive_ms)
        if info.fingerprint and info.fingerprint != layout.fingerprint():
            log.warning("peer fingerprint %s differs from local %s", info.fingerprint.hex(), layout.fingerprint().hex())
        s = Session(self, layout, info)
        with self._lock:
            self._sessions.append(s)
        return s

    def close(self) -> None:
        """Closes every session, then the channel. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            sessions, self._sessions = self._sessions, []
        for s in sessions:
            s.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Session:
    """An open engine session: layout, buffers and leases live with it."""

    def __init__(self, client: Client, layout: Layout, info: SessionInfo) -> None:
        self.client = client
        self.layout = layout
        self.info = info
        self.id = info.session_id
        self._stop = threading.Event()
        self.lost: Optional[errors.OrbitKVError] = None
        granted_ms = info.keepalive_ms or 10000
        interval = max(granted_ms, 300) / 3000.0  # three keepalives per granted interval
        self._keepalive = threading.Thread(
            target=self._keepalive_loop, args=(interval,), name=f"orbitkv-keepalive-{self.id[:8]}", daemon=True
        )
        self._keepalive.start()

    # keepalive -------------------------------------------------------------

    def _keepalive_loop(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.client.call("keepalive", "Keepalive", engine_pb2.KeepaliveRequest(session_id=self.id))
            except errors.NotFound as e:
                self.lost = errors.SessionLost(f"session {self.id} expired: {e}", e.code)
                log.error("orbitkv session lost: %s", e)
                return
            except errors.OrbitKVError as e:
                log.warning("orbitkv keepalive failed (will retry): %s", e)

    def _check(self) -> None:
        if self._stop.is_set():
            raise errors.SessionLost(f"session {self.id} is closed")
        if self.lost is not None:
            raise self.lost

    # calls -----------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, lease_ms: int = 0) -> LookupResult:
        self._check()
        req = engine_pb2.LookupRequest(session_id=self.id, keys=list(keys), lease=lease, lease_ms=lease_ms)
        r = self.client.call("lookup", "Lookup", req)
        return LookupResult(r.hit_pages, r.tiers.dram, r.tiers.ssd, r.tiers.remote, r.lease_id, r.lease_expires_unix_ms)

    def save(self, pages: Iterable[PageRef], *, durability: Durability = Durability.DRAM, deadline_ms: int = 0) -> "Op":
        self._check()
        refs = [p.to_proto() for p in pages]
        req = engine_pb2.SaveRequest(session_id=self.id, pages=refs, durability=int(durability), deadline_ms=deadline_ms)
        h = self.client.call("save", "Save", req)
        return Op(self, h.op_id, "save", len(refs))

    def load(self, pages: Iterable[PageRef], *, lease_id: str = "", deadline_ms: int = 0) -> "Op":
        self._check()
        refs = [p.to_proto() for p in pages]
        req = engine_pb2.LoadRequest(session_id=self.id, lease_id=lease_id, pages=refs, deadline_ms=deadline_ms)
        h = self.client.call("load", "Load", req)
        return Op(self, h.op_id, "load", len(refs))

    def release(self, lease_id: str) -> None:
        if not lease_id:
            return
        self._check()
        self.client.call("release lease", "Release", engine_pb2.ReleaseRequest(session_id=self.id, lease_id=lease_id))

    def close(self) -> None:
        """Stops the keepalive and closes the session at the peer. Idempotent."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._keepalive is not threading.current_thread():
            self._keepalive.join()
        try:
            self.client.call("close session", "CloseSession", engine_pb2.CloseSessionRequest(session_id=self.id))
        except errors.OrbitKVError as e:
            log.info("orbitkv close session %s: %s", self.id, e)


class Op:
    """A save or load running in the peer."""

    def __init__(self, session: Session, op_id: str, kind: str, num_pages: int) -> None:
        self.session = session
        self.op_id = op_id
        self.kind = kind
        self.num_pages = num_pages

    def _wait_once(self, timeout_ms: int) -> OpResult:
        req = engine_pb2.WaitRequest(session_id=self.session.id, op_id=self.op_id, timeout_ms=timeout_ms)
        rpc_timeout = self.session.client.timeout + timeout_ms / 1000.0
        st = self.session.client.call(f"wait {self.kind}", "Wait", req, timeout=rpc_timeout)
        pages = tuple(PageResult(PageCode(p.code), Tier(p.tier), p.message) for p in st.pages)
        return OpResult(self.op_id, st.done, pages)

    def poll(self) -> OpResult:
        """Returns the current status without waiting."""
        return self._wait_once(0)

    def wait(self, timeout: float) -> OpResult:
        """Waits up to ``timeout`` seconds; the result's ``done`` says whether
        the operation finished."""
        deadline = time.monotonic() + timeout
        while True:
            left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
            res = self._wait_once(min(left_ms, _MAX_WAIT_SLICE_MS))
            if res.done or left_ms == 0:
                return res


DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8_e4m3": 1, "fp8_e5m2": 1, "u8": 1}


class ControlSession:
    """A session used only for lookups and lease releases (the vLLM
    scheduler process has no KV buffers). The peer is first asked for a
    session without buffers; if it insists on buffers, a one-block dummy
    shared-memory buffer is registered instead (removed on close)."""

    def __init__(self, client: Client, layout: Layout, block_tokens: int, engine_id: str = "scheduler") -> None:
        self._dummy: Optional[str] = None
        try:
            self.session = client.open_session(
                layout, block_tokens=block_tokens, num_blocks=0, buffers=[], segments=[], engine_id=engine_id
            )
        except errors.InvalidRequest as e:
            log.info("peer wants buffers for a control session (%s); registering a dummy block", e)
            self.session = self._open_with_dummy(client, layout, block_tokens, engine_id)

    def _open_with_dummy(self, client: Client, layout: Layout, block_tokens: int, engine_id: str) -> Session:
        import os
        import tempfile

        block_bytes = block_tokens * layout.kv_heads * layout.head_dim * DTYPE_BYTES.get(layout.dtype, 2)
        n = 2 * layout.num_layers
        fd, path = tempfile.mkstemp(prefix="orbitkv-ctl-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.ftruncate(fd, n * block_bytes)
        os.close(fd)
        self._dummy = path
        segs = [Segment(i // 2, i % 2, 0, i * block_bytes, block_bytes, block_bytes) for i in range(n)]
        return client.open_session(
            layout, block_tokens=block_tokens, num_blocks=1,
            buffers=[ShmBuffer(path, n * block_bytes)], segments=segs, engine_id=engine_id,
        )

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, lease_ms: int = 0) -> LookupResult:
        return self.session.lookup(keys, lease=lease, lease_ms=lease_ms)

    def release(self, lease_id: str) -> None:
        self.session.release(lease_id)

    def close(self) -> None:
        self.session.close()
        if self._dummy:
            import os

            try:
                os.unlink(self._dummy)
            except FileNotFoundError:
                pass
            self._dummy = None
