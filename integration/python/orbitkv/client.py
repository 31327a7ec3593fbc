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

Lazy use (``Client(..., lazy=True)``, ``open_session(..., lazy=True)``):
the engine starts while the peer is down or restarting. The client does not
wait for the socket, and a session that cannot be opened yet is returned
unopened (``ready`` False, ``lost`` set); its keepalive thread, and any call
on it, retry the open at most once per RETRY_INTERVAL_S, each attempt
bounded by the open's deadline. Adapters check ``Session.ready`` and skip the
cache (0 hits, saves not made) until it is True. Reachability changes are
logged once per transition by the Client, not per call.

A peer that is down refuses the connection at once (no socket, or no one
listening): an open fails fast and, lazily, is retried in the background. A
peer that accepted the connection but is slow to answer (busy, paused) is
waited for: a connection attempt and a session open wait up to
``connect_timeout`` (Client; default DEFAULT_CONNECT_TIMEOUT_S, 5 s; an
open's deadline is the larger of it and ``timeout``) before the peer counts
as unreachable.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import threading
import time
from typing import Any, Callable, Iterable, Optional, Sequence

import grpc
from google.protobuf.message import DecodeError

from orbitkv import errors, lane
from orbitkv._proto import engine_pb2, engine_pb2_grpc
from orbitkv.buffers import Buffer, Segment
from orbitkv.keys import Layout

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0
# While the peer is unreachable, a session's open is retried (and its
# keepalive probes) at most once per this many seconds.
RETRY_INTERVAL_S = 1.0
_MAX_WAIT_SLICE_MS = 1000
# How long a connection attempt, and a session's open, may wait for a peer
# that accepted the connection but has not answered yet (busy, paused).
DEFAULT_CONNECT_TIMEOUT_S = 5.0


def _channel_options(connect_timeout: float) -> list[tuple[str, int]]:
    """A peer that is down refuses the connection at once: retry it every
    100 ms to 1 s instead of gRPC's default backoff (up to 120 s). gRPC also
    takes min_reconnect_backoff_ms as the least time a connection attempt
    may take (its connect timeout, default 20 s): it is connect_timeout, so
    a peer slow to finish the handshake is waited for, not given up on."""
    return [
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", max(100, int(connect_timeout * 1000))),
        ("grpc.max_reconnect_backoff_ms", 1000),
    ]


# The engine calls the lane carries, with their answers' types. OpenSession
# stays on gRPC: its channel-ready wait is how a session waits for a peer
# that is starting.
_LANE_METHODS = {
    "Keepalive": engine_pb2.KeepaliveResponse,
    "CloseSession": engine_pb2.CloseSessionResponse,
    "Lookup": engine_pb2.LookupResponse,
    "Save": engine_pb2.OpHandle,
    "Load": engine_pb2.OpHandle,
    "Wait": engine_pb2.OpStatus,
    "Release": engine_pb2.ReleaseResponse,
}


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


# In a load's PageRef.blocks: "do not copy this block" (the engine already
# holds it). Loads only; a page needs at least one real block.
SKIP_BLOCK = 0xFFFFFFFF


@dataclasses.dataclass(frozen=True)
class PageRef:
    """One page and the engine blocks holding it, in sequence order (a load
    may name SKIP_BLOCK for blocks the engine already holds)."""

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
    recompute_pages: int = 0  # found only on SSD, left out: recomputing is faster (slow disk)
    budget_cut_pages: int = 0  # held, left out: the query budget is pinned by other leases


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

    def __init__(self, socket_path: str, *, timeout: float = DEFAULT_TIMEOUT_S,
                 connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S, lazy: bool = False,
                 use_lane: Optional[bool] = None) -> None:
        """``lazy``: do not wait for the socket (the peer may be down or not
        started yet); the channel connects on first use and keeps retrying.
        Otherwise raise PeerUnavailable if it is not ready within
        ``connect_timeout``.

        ``connect_timeout`` (seconds) is also how long each connection
        attempt, and each session open (lazy or not; the open's deadline is
        the larger of it and ``timeout``), waits for a peer that accepted the
        connection but is slow to answer (busy, paused): such a peer is
        waited for, not reported unreachable. A peer that is down refuses at
        once, whatever the deadline: a lazy open then returns unopened and
        retries in the background.

        ``use_lane`` (default: unless ORBITKV_LANE=0): make the engine calls
        but OpenSession on the peer's engine lane (orbitkv.lane), falling
        back to gRPC while the lane cannot be reached."""
        self.socket_path = socket_path
        self.timeout = timeout
        self.connect_timeout = connect_timeout
        self._channel = grpc.insecure_channel("unix:" + socket_path, options=_channel_options(connect_timeout))
        self._reachable: Optional[bool] = None  # None: unknown yet
        self._state_lock = threading.Lock()
        if not lazy:
            try:
                grpc.channel_ready_future(self._channel).result(timeout=connect_timeout)
            except grpc.FutureTimeoutError:
                self._channel.close()
                raise errors.PeerUnavailable(f"connect {socket_path}: not ready within {connect_timeout}s", "UNAVAILABLE")
            self._reachable = True
        self.stub = engine_pb2_grpc.EngineServiceStub(self._channel)
        self._lane = lane.Lane(socket_path + lane.SUFFIX, connect_timeout) if \
            (lane.enabled() if use_lane is None else use_lane) else None
        self._sessions: list[Session] = []
        self._lock = threading.Lock()
        self._closed = False

    @property
    def reachable(self) -> bool:
        """False once a call found the peer unreachable, until a call gets an
        answer again (unknown counts as reachable)."""
        return self._reachable is not False

    def _set_reachable(self, up: bool, why: str = "") -> None:
        if self._reachable is up:
            return
        with self._state_lock:
            if self._reachable is up:
                return
            before, self._reachable = self._reachable, up
        if not up:
            log.warning("orbitkv peer %s unreachable (%s): serving without the external KV cache "
                        "(requests recompute) and retrying in the background", self.socket_path, why)
        elif before is False:
            log.warning("orbitkv peer %s reachable again", self.socket_path)

    def call(self, action: str, method: str, request, timeout: Optional[float] = None):
        """Invokes one RPC with a deadline, mapping errors: on the engine
        lane if it is reachable, else over gRPC."""
        if self._lane is not None and method in _LANE_METHODS:
            try:
                out = self._lane.call(action, method, request.SerializeToString(), timeout or self.timeout)
            except lane.Unreachable:
                pass  # over gRPC, which also decides whether the peer is reachable
            except errors.OrbitKVError as err:
                self._answered(err)
                raise
            else:
                self._set_reachable(True)
                try:
                    return _LANE_METHODS[method].FromString(out)
                except DecodeError as e:
                    raise errors.from_code(action, "INTERNAL", f"lane: undecodable answer: {e}") from None
        try:
            resp = getattr(self.stub, method)(request, timeout=timeout or self.timeout)
        except grpc.RpcError as e:
            err = errors.from_rpc_error(action, e)
            self._answered(err)
            raise err from None
        self._set_reachable(True)
        return resp

    def _answered(self, err: errors.OrbitKVError) -> None:
        """Notes what a failed call says of the peer's reachability."""
        if isinstance(err, errors.PeerUnavailable):
            self._set_reachable(False, str(err))
        elif not isinstance(err, errors.PeerTimeout) and err.code:
            self._set_reachable(True)  # the peer answered (with an error)

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
        lazy: bool = False,
        recompute_tokens_per_s: int = 0,
    ) -> "Session":
        """Registers an engine worker's KV buffers. With no buffers, no
        segments and ``num_blocks`` 0 the session is lookup-only: it may
        Lookup and Release, and the peer refuses its Save and Load.

        ``lazy``: one attempt now; if the peer is unreachable (or does not
        answer in time) the session is returned unopened and opens itself
        later (see the module doc). Other refusals raise as usual.

        ``recompute_tokens_per_s``: the engine's prefill throughput for this
        model; with it the peer's lookups leave pages it holds only on SSD
        to recompute while its SSD reads are slower than that (0: restore
        whatever is found)."""
        req = engine_pb2.OpenSessionRequest(
            engine_id=engine_id,
            layout=layout.to_proto(),
            block_tokens=block_tokens,
            num_blocks=num_blocks,
            buffers=[b.to_proto() for b in buffers],
            segments=[s.to_proto() for s in segments],
            keepalive_ms=keepalive_ms,
            recompute_tokens_per_s=recompute_tokens_per_s,
        )
        if not lazy:
            s = Session(self, layout, req, self._open(layout, req))
        else:
            s = Session(self, layout, req, None)
            try:
                s._reopen("", "first open")
            except errors.SessionLost:
                e = s._last_error
                if e is not None and not _transient(e):
                    s.close()
                    raise e from None
            s.generation = 0  # generation counts openings after this call
        with self._lock:
            self._sessions.append(s)
        return s

    def open_lookup_session(self, layout: Layout, *, block_tokens: int, engine_id: str = "scheduler",
                            lazy: bool = False, recompute_tokens_per_s: int = 0) -> "Session":
        """A lookup-only session (an engine's scheduler process): the peer
        derives the page size, for the query budget, from the layout."""
        return self.open_session(
            layout, block_tokens=block_tokens, num_blocks=0, buffers=(), segments=(), engine_id=engine_id, lazy=lazy,
            recompute_tokens_per_s=recompute_tokens_per_s,
        )

    def _open(self, layout: Layout, req: engine_pb2.OpenSessionRequest) -> "SessionInfo":
        resp = self.call("open session", "OpenSession", req, timeout=max(self.timeout, self.connect_timeout))
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
        if self._lane is not None:
            self._lane.close()
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _transient(e: errors.OrbitKVError) -> bool:
    """Whether an open failed because the peer is down or slow (retry later)."""
    return isinstance(e, (errors.PeerUnavailable, errors.PeerTimeout))


_NOT_OPENED = SessionInfo("", b"", 0, 0)


class Session:
    """An open engine session: layout, buffers and leases live with it.

    ``id`` changes when the session is reopened after the peer forgot it
    (``generation`` counts reopenings); ``lost`` is set while the session is
    known to be gone (or, lazily opened, not opened yet) and could not be
    (re)opened yet; ``ready`` says whether calls are worth making."""

    def __init__(self, client: Client, layout: Layout, req: engine_pb2.OpenSessionRequest,
                 info: Optional[SessionInfo]) -> None:
        self.client = client
        self.layout = layout
        self.info = info or _NOT_OPENED
        self.id = self.info.session_id
        self.generation = 0
        self.lost: Optional[errors.OrbitKVError] = None
        if info is None:
            self.lost = errors.SessionLost("session not opened yet", "UNAVAILABLE")
        self._last_error: Optional[errors.OrbitKVError] = None
        self._next_attempt = 0.0  # monotonic time before which a lost session is not reopened
        self._req = req
        self._reopen_lock = threading.Lock()
        self._stop = threading.Event()
        self._keepalive = threading.Thread(
            target=self._keepalive_loop, name=f"orbitkv-keepalive-{req.engine_id}", daemon=True
        )
        self._keepalive.start()

    @property
    def ready(self) -> bool:
        """Open, not closed, and the peer not known to be unreachable."""
        return not self._stop.is_set() and self.lost is None and bool(self.id) and self.client.reachable

    # keepalive and reopening ------------------------------------------------

    def _interval(self) -> float:
        if self.lost is not None or not self.client.reachable:
            return RETRY_INTERVAL_S
        granted_ms = self.info.keepalive_ms or 10000
        return max(granted_ms, 300) / 3000.0  # three keepalives per granted interval

    def _keepalive_loop(self) -> None:
        while not self._stop.wait(self._interval()):
            if self.lost is not None:  # not opened yet, or a reopen failed: try again
                try:
                    self._reopen(self.id, str(self.lost), wait=False)
                except errors.OrbitKVError:
                    pass  # logged by _reopen / the client, once per transition
                continue
            sid = self.id
            try:
                self.client.call("keepalive", "Keepalive", engine_pb2.KeepaliveRequest(session_id=sid))
            except errors.NotFound as e:
                try:
                    self._reopen(sid, f"keepalive: {e}")
                except errors.OrbitKVError:
                    pass
            except errors.OrbitKVError as e:
                log.debug("orbitkv keepalive failed (will retry): %s", e)

    def _reopen(self, sid: str, why: str, *, wait: bool = True) -> None:
        """Opens the session again unless another thread already replaced
        ``sid``; raises SessionLost (and sets ``lost``) if the peer refuses.
        Once an attempt failed, the next is made RETRY_INTERVAL_S later at
        the earliest (earlier calls raise ``lost`` at once); with ``wait``
        False a call does not wait for another thread's attempt either."""
        if not self._reopen_lock.acquire(blocking=wait):
            raise self.lost or errors.SessionLost(f"session {sid} is being reopened", "UNAVAILABLE")
        try:
            if self._stop.is_set():
                raise errors.SessionLost(f"session {sid} is closed")
            if self.id != sid:
                return
            now = time.monotonic()
            if self.lost is not None and now < self._next_attempt:
                raise self.lost
            self._next_attempt = now + RETRY_INTERVAL_S
            try:
                info = self.client._open(self.layout, self._req)
            except errors.OrbitKVError as e:
                first = self.lost is None or self._last_error is None or type(e) is not type(self._last_error)
                self._last_error = e
                what = f"session {sid}" if sid else "session"
                self.lost = errors.SessionLost(f"{what} lost ({why}); reopen failed: {e}", e.code) if sid else \
                    errors.SessionLost(f"session not opened yet: {e}", e.code)
                if first and not _transient(e):  # unreachable peers are logged by the client
                    log.warning("orbitkv %s cannot be opened (will retry every %gs): %s", what, RETRY_INTERVAL_S, e)
                raise self.lost from None
            self.info, self.id, self.lost, self._last_error = info, info.session_id, None, None
            self.generation += 1
        finally:
            self._reopen_lock.release()
        if sid:
            log.warning("orbitkv session %s lost (%s); reopened as %s", sid, why, info.session_id)
        else:
            log.info("orbitkv session %s opened", info.session_id)

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
            self._reopen(self.id, str(self.lost), wait=False)

    def _call(self, action: str, method: str, make_req: Callable[[str], Any],
              timeout: Optional[float] = None) -> tuple[Any, str]:
        """One RPC on behalf of this session: (response, session id used). A
        NotFound for which a probe shows the session itself is unknown (the
        peer restarted) reopens the session and retries once."""
        self._check()
        sid = self.id
        try:
            return self.client.call(action, method, make_req(sid), timeout=timeout), sid
        except errors.NotFound:
            if not self._gone(sid):
                raise
        self._reopen(sid, f"{action}: session unknown to the peer")
        sid = self.id
        return self.client.call(action, method, make_req(sid), timeout=timeout), sid

    def _op(self, h: Any, sid: str, kind: str, n: int) -> "Op":
        op = Op(self, sid, h.op_id, kind, n)
        if h.HasField("status") and h.status.done:  # a call that waited: the result is here
            op._result = _op_result(h.op_id, h.status)
        return op

    def _wait_timeout(self, wait: bool, deadline_ms: int) -> Optional[float]:
        # A call that waits lasts as long as its operation may (the peer ends
        # the operation before the call's deadline), plus the usual margin.
        return self.client.timeout + (deadline_ms or _DEFAULT_OP_MS) / 1000.0 if wait else None

    # calls -----------------------------------------------------------------

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, lease_ms: int = 0,
               recompute_tokens_per_s: int = 0, lease_from: int = 0) -> LookupResult:
        """``recompute_tokens_per_s``: the engine's prefill rate as it measures
        it now (0: the session's declared rate); with it the peer leaves
        SSD-only pages to recompute while its SSD reads are slower.
        ``lease_from``: leading pages the engine holds itself (its own prefix
        cache): the hit still counts them, but the lease, the query budget,
        the SSD cut and the tier counts take only the pages after them."""
        keys = list(keys)
        r, _ = self._call("lookup", "Lookup", lambda sid: engine_pb2.LookupRequest(
            session_id=sid, keys=keys, lease=lease, lease_ms=lease_ms,
            recompute_tokens_per_s=max(0, int(recompute_tokens_per_s)), lease_from=max(0, min(int(lease_from), len(keys)))))
        return LookupResult(r.hit_pages, r.tiers.dram, r.tiers.ssd, r.tiers.remote, r.lease_id, r.lease_expires_unix_ms,
                            r.recompute_pages, r.budget_cut_pages)

    def save(self, pages: Iterable[PageRef], *, durability: Durability = Durability.DRAM, deadline_ms: int = 0,
             wait: bool = False) -> "Op":
        """Saves pages. ``wait``: the call returns once the save is done (one
        RPC instead of Save then Wait; the returned Op already holds the
        result, and its ``wait`` returns at once)."""
        refs = [p.to_proto() for p in pages]
        h, sid = self._call("save", "Save", lambda sid: engine_pb2.SaveRequest(
            session_id=sid, pages=refs, durability=int(durability), deadline_ms=deadline_ms, wait=wait),
            timeout=self._wait_timeout(wait, deadline_ms))
        return self._op(h, sid, "save", len(refs))

    def load(self, pages: Iterable[PageRef], *, lease_id: str = "", deadline_ms: int = 0,
             layerwise: bool = False, wait: bool = False, end_lease: bool = False) -> "Op":
        """Loads pages into this session's blocks. ``lease_id`` may come from
        any session of the peer for the same model, any TP rank (the
        scheduler's lookup-only one); an unknown or expired lease raises
        NotFound, another model's FailedPrecondition (load without it then).

        ``layerwise`` (sessions with ``info.layer_events``): the peer copies
        layer-major and records layer event l once layer l of every page is
        in place; the call returns once all of it is enqueued on the device,
        so the engine can make its stream wait on the events right away. One
        layer-wise load per session at a time; enqueue the waits on one
        load's events before starting the next (the events are reused).

        ``wait`` (not with ``layerwise``): as for ``save``.

        ``end_lease``: the peer ends the lease when the load ends (its query
        budget is free at once); releasing it afterwards raises NotFound."""
        if wait and layerwise:
            raise ValueError("a layer-wise load answers once enqueued; it cannot also wait")
        refs = [p.to_proto() for p in pages]
        h, sid = self._call("load", "Load", lambda sid: engine_pb2.LoadRequest(
            session_id=sid, lease_id=lease_id, pages=refs, deadline_ms=deadline_ms, layerwise=layerwise, wait=wait,
            end_lease=end_lease and bool(lease_id)),
            timeout=self._wait_timeout(wait, deadline_ms))
        return self._op(h, sid, "load", len(refs))

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
        if not self.id or not self.client.reachable:
            return  # never opened, or the peer is down: nothing to close there
        try:
            self.client.call("close session", "CloseSession", engine_pb2.CloseSessionRequest(session_id=self.id))
        except errors.OrbitKVError as e:
            log.info("orbitkv close session %s: %s", self.id, e)


def _op_result(op_id: str, st: Any) -> OpResult:
    pages = tuple(PageResult(PageCode(p.code), Tier(p.tier), p.message) for p in st.pages)
    return OpResult(op_id, st.done, pages)


_DEFAULT_OP_MS = 30000  # the peer's default operation deadline (--op-deadline)


class Op:
    """A save or load running in the peer."""

    def __init__(self, session: Session, session_id: str, op_id: str, kind: str, num_pages: int) -> None:
        self.session = session
        self.session_id = session_id  # the session generation that started it
        self.op_id = op_id
        self.kind = kind
        self.num_pages = num_pages
        self._result: Optional[OpResult] = None  # set when the call waited

    def _wait_once(self, timeout_ms: int) -> OpResult:
        if self._result is not None:
            return self._result
        req = engine_pb2.WaitRequest(session_id=self.session_id, op_id=self.op_id, timeout_ms=timeout_ms)
        rpc_timeout = self.session.client.timeout + timeout_ms / 1000.0
        st = self.session.client.call(f"wait {self.kind}", "Wait", req, timeout=rpc_timeout)
        return _op_result(self.op_id, st)

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

    def __init__(self, client: Client, layout: Layout, block_tokens: int, engine_id: str = "scheduler",
                 lazy: bool = False, recompute_tokens_per_s: int = 0) -> None:
        self.session = client.open_lookup_session(layout, block_tokens=block_tokens, engine_id=engine_id, lazy=lazy,
                                                  recompute_tokens_per_s=recompute_tokens_per_s)

    @property
    def available(self) -> bool:
        """Whether lookups are worth making (the session is open and the
        peer reachable); the scheduler reports misses otherwise."""
        return self.session.ready

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, lease_ms: int = 0,
               recompute_tokens_per_s: int = 0, lease_from: int = 0) -> LookupResult:
        return self.session.lookup(keys, lease=lease, lease_ms=lease_ms, recompute_tokens_per_s=recompute_tokens_per_s,
                                   lease_from=lease_from)

    def release(self, lease_id: str) -> None:
        self.session.release(lease_id)

    def close(self) -> None:
        self.session.close()
