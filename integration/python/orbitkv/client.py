"""Client of the peer's EngineService over its Unix socket.

Every call carries a gRPC deadline; errors become orbitkv.errors exceptions.
A Session owns a keepalive thread that stops when the session closes.
Save and Load return Op handles: the copy runs in the peer; ``Op.wait``
polls its per-page results until done or until the caller's timeout.

A peer that restarts forgets its sessions. A Session notices (its keepalive,
or a call, gets NotFound and a Keepalive probe confirms the session is
unknown) and opens itself again with the same request: buffers are
registered anew, while leases and operations of the old session are gone
(their calls fail, and the engine recomputes). While the peer is down, calls
fail fast with PeerUnavailable; nothing waits past its deadline.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import grpc

from orbitkv import errors
from orbitkv._proto import engine_pb2, engine_pb2_grpc
from orbitkv.buffers import Buffer, Segment
from orbitkv.keys import Layout

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
_MAX_WAIT_SLICE_MS = 1000
# A Unix socket either accepts at once or not at all: retry a lost peer every
# 100 ms to 1 s instead of gRPC's default backoff (up to 120 s).
_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]


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
    # CUDA sessions of a peer that supports layer-wise loads: one 64-byte
    # interprocess CUDA event handle per layer (see Session.load).
    layer_events: tuple[bytes, ...] = ()


class Client:
    """A connection to one peer. ``timeout`` (seconds) bounds every call."""

    def __init__(self, socket_path: str, *, timeout: float = DEFAULT_TIMEOUT_S, connect_timeout: float = 5.0) -> None:
        self.socket_path = socket_path
        self.timeout = timeout
        self._channel = grpc.insecure_channel("unix:" + socket_path, options=_CHANNEL_OPTIONS)
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
        """Registers an engine worker's KV buffers. With no buffers, no
        segments and ``num_blocks`` 0 the session is lookup-only: it may
        Lookup and Release, and the peer refuses its Save and Load."""
        req = engine_pb2.OpenSessionRequest(
            engine_id=engine_id,
            layout=layout.to_proto(),
            block_tokens=block_tokens,
            num_blocks=num_blocks,
            buffers=[b.to_proto() for b in buffers],
            segments=[s.to_proto() for s in segments],
            keepalive_ms=keepalive_ms,
        )
        s = Session(self, layout, req, self._open(layout, req))
        with self._lock:
            self._sessions.append(s)
        return s

    def open_lookup_session(self, layout: Layout, *, block_tokens: int, engine_id: str = "scheduler") -> "Session":
        """A lookup-only session (an engine's scheduler process): the peer
        derives the page size, for the query budget, from the layout."""
        return self.open_session(
            layout, block_tokens=block_tokens, num_blocks=0, buffers=(), segments=(), engine_id=engine_id
        )

    def _open(self, layout: Layout, req: engine_pb2.OpenSessionRequest) -> "SessionInfo":
        resp = self.call("open session", "OpenSession", req)
        info = SessionInfo(resp.session_id, bytes(resp.layout_fingerprint), resp.page_bytes, resp.keepalive_ms,
                           tuple(bytes(h) for h in resp.layer_events))
        if info.fingerprint and info.fingerprint != layout.fingerprint():
            log.warning("peer fingerprint %s differs from local %s", info.fingerprint.hex(), layout.fingerprint().hex())
        return info

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
    """An open engine session: layout, buffers and leases live with it.

    ``id`` changes when the session is reopened after the peer forgot it
    (``generation`` counts reopenings); ``lost`` is set while the session is
    known to be gone and could not be reopened yet."""

    def __init__(self, client: Client, layout: Layout, req: engine_pb2.OpenSessionRequest, info: SessionInfo) -> None:
        self.client = client
        self.layout = layout
        self.info = info
        self.id = info.session_id
        self.generation = 0
        self.lost: Optional[errors.OrbitKVError] = None
        self._req = req
        self._reopen_lock = threading.Lock()
        self._stop = threading.Event()
        granted_ms = info.keepalive_ms or 10000
        interval = max(granted_ms, 300) / 3000.0  # three keepalives per granted interval
        self._keepalive = threading.Thread(
            target=self._keepalive_loop, args=(interval,), name=f"orbitkv-keepalive-{self.id[:8]}", daemon=True
        )
        self._keepalive.start()

    # keepalive and reopening ------------------------------------------------

    def _keepalive_loop(self, interval: float) -> None:
        failing = False
        while not self._stop.wait(interval):
            sid = self.id
            try:
                self.client.call("keepalive", "Keepalive", engine_pb2.KeepaliveRequest(session_id=sid))
                failing = False
            except errors.NotFound as e:
                try:
                    self._reopen(sid, f"keepalive: {e}")
                except errors.OrbitKVError as e2:
                    log.warning("orbitkv: %s (will retry)", e2)
            except errors.OrbitKVError as e:
                (log.debug if failing else log.warning)("orbitkv keepalive failed (will retry): %s", e)
                failing = True

    def _reopen(self, sid: str, why: str) -> None:
        """Opens the session again unless another thread already replaced
        ``sid``; raises SessionLost (and sets ``lost``) if the peer refuses."""
        with self._reopen_lock:
            if self._stop.is_set():
                raise errors.SessionLost(f"session {sid} is closed")
            if self.id != sid:
                return
            try:
                info = self.client._open(self.layout, self._req)
            except errors.OrbitKVError as e:
                self.lost = errors.SessionLost(f"session {sid} lost ({why}); reopen failed: {e}", e.code)
                raise self.lost from None
            self.info, self.id, self.lost = info, info.session_id, None
            self.generation += 1
        log.warning("orbitkv session %s lost (%s); reopened as %s", sid, why, info.session_id)

    def _gone(self, sid: str) -> bool:
        """Whether the peer no longer knows session ``sid`` (a Keepalive probe)."""
        try:
            self.client.call("keepalive", "Keepalive", engine_pb2.KeepaliveRequest(session_id=sid))
            return False
        except errors.NotFound:
            return True
        except errors.OrbitKVError:
            return False

    def _check(self) -> None:
        if self._stop.is_set():
            raise errors.SessionLost(f"session {self.id} is closed")
        if self.lost is not None:
            self._reopen(self.id, str(self.lost))

    def _call(self, action: str, method: str, make_req: Callable[[str], Any]) -> tuple[Any, str]:
        """One RPC on behalf of this session: (response, session id used). A
        NotFound for which a probe shows the session itself is unknown (the
        peer restarted) reopens the session and retries once."""
        self._check()
        sid = self.id
        try:
            return self.client.call(action, method, make_req(sid)), sid
        except errors.NotFound:
            if not self._gone(sid):
                raise
        self._reopen(sid, f"{action}: session unknown to the peer")
        sid = self.id
        return self.client.call(action, method, make_req(sid)), sid

    # calls -----------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, lease_ms: int = 0) -> LookupResult:
        keys = list(keys)
        r, _ = self._call("lookup", "Lookup", lambda sid: engine_pb2.LookupRequest(
            session_id=sid, keys=keys, lease=lease, lease_ms=lease_ms))
        return LookupResult(r.hit_pages, r.tiers.dram, r.tiers.ssd, r.tiers.remote, r.lease_id, r.lease_expires_unix_ms)

    def save(self, pages: Iterable[PageRef], *, durability: Durability = Durability.DRAM, deadline_ms: int = 0) -> "Op":
        refs = [p.to_proto() for p in pages]
        h, sid = self._call("save", "Save", lambda sid: engine_pb2.SaveRequest(
            session_id=sid, pages=refs, durability=int(durability), deadline_ms=deadline_ms))
        return Op(self, sid, h.op_id, "save", len(refs))

    def load(self, pages: Iterable[PageRef], *, lease_id: str = "", deadline_ms: int = 0,
             layerwise: bool = False) -> "Op":
        """Loads pages into this session's blocks. ``lease_id`` may come from
        any session of the peer (the scheduler's lookup-only one).

        ``layerwise`` (sessions with ``info.layer_events``): the peer copies
        layer-major and records layer event l once layer l of every page is
        in place; the call returns once all of it is enqueued on the device,
        so the engine can make its stream wait on the events right away. One
        layer-wise load per session at a time; enqueue the waits on one
        load's events before starting the next (the events are reused)."""
        refs = [p.to_proto() for p in pages]
        h, sid = self._call("load", "Load", lambda sid: engine_pb2.LoadRequest(
            session_id=sid, lease_id=lease_id, pages=refs, deadline_ms=deadline_ms, layerwise=layerwise))
        return Op(self, sid, h.op_id, "load", len(refs))

    def release(self, lease_id: str) -> None:
        if not lease_id:
            return
        self._check()
        self.client.call("release lease", "Release", engine_pb2.ReleaseRequest(session_id=self.id, lease_id=lease_id))

    def close(self) -> None:
        """Stops the keepalive and closes the session at the peer. Idempotent."""
        if self._stop.is_set():
            return
        with self._reopen_lock:
            self._stop.set()
        if self._keepalive is not threading.current_thread():
            self._keepalive.join()
        try:
            self.client.call("close session", "CloseSession", engine_pb2.CloseSessionRequest(session_id=self.id))
        except errors.OrbitKVError as e:
            log.info("orbitkv close session %s: %s", self.id, e)


class Op:
    """A save or load running in the peer."""

    def __init__(self, session: Session, session_id: str, op_id: str, kind: str, num_pages: int) -> None:
        self.session = session
        self.session_id = session_id  # the session generation that started it
        self.op_id = op_id
        self.kind = kind
        self.num_pages = num_pages

    def _wait_once(self, timeout_ms: int) -> OpResult:
        req = engine_pb2.WaitRequest(session_id=self.session_id, op_id=self.op_id, timeout_ms=timeout_ms)
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
    """A lookup-only session (the vLLM scheduler process has no KV
    buffers): lookups and lease releases, which a worker's Load may use."""

    def __init__(self, client: Client, layout: Layout, block_tokens: int, engine_id: str = "scheduler") -> None:
        self.session = client.open_lookup_session(layout, block_tokens=block_tokens, engine_id=engine_id)

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, lease_ms: int = 0) -> LookupResult:
        return self.session.lookup(keys, lease=lease, lease_ms=lease_ms)

    def release(self, lease_id: str) -> None:
        self.session.release(lease_id)

    def close(self) -> None:
        self.session.close()
