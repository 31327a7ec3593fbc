"""The tier's worker: the only thread that talks to the peer (in a process
of its own by default: orbitkv.vllm_tier.worker).

The scheduler thread (the tier's methods, under vLLM's manager lock) never
waits on the peer: it puts commands on ``commands`` (lookup probes, store
and load jobs) and takes answers from ``results``. This thread owns the
client, the sessions, the regions the peer maps and every operation in flight.

Lanes. Stores and loads each go through a lane: a region the peer maps and
the session that registered it. With ``zero_copy`` "auto" (the default)
stores read vLLM's pool file in place and loads land in a staging file and
are copied into the pool; "on" puts loads in place too; "off" stages both.

Every call to the peer has a deadline (``rpc_timeout_s``), every operation a
peer-side deadline, and every job an end that vLLM sees without waiting on
the peer: done when the peer says so; failed when the operation is known
gone (the peer refused the connection, or forgot the operation or the
session: it restarted); failed ``abandon_grace_s`` past its deadline when
the peer stopped answering. A peer that is down, slow, restarting or full
turns lookups into "absent" and jobs into failures, never into errors.

Slots (the failure this prevents: a frozen peer that wakes up and copies
into memory that was handed to someone else; "wrong output, no error").
The peer times an operation from when it reads the request, so an operation
whose outcome the tier could not learn may still run after its deadline, on
rows it names. Its rows are released only once the operation is *settled*:
the peer was seen gone after it was sent (refused, or the session reopened),
or the peer answered a later call at t and ``deadline + abandon_grace_s``
has passed since t (the operation, if it started, ended by then). Until then
a staging slot stays quarantined (the job itself already failed: nothing
waits), and a store from vLLM's pool stays open, its rows pinned by vLLM (no
request waits on a store; ``drain_jobs`` does, as vLLM's contract asks). A
load into vLLM's pool ("on") cannot be held without holding its request: it
fails at its abandon time and its rows go back to vLLM, the one unguarded
case (docs/compatibility.md, "Known limits").
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Optional, Sequence

from orbitkv import errors
from orbitkv._proto import engine_pb2
from orbitkv.client import Client, Durability, PageRef, Session
from orbitkv.keys import Layout
from orbitkv.vllm_tier.config import TierConfig
from orbitkv.vllm_tier.staging import PoolRegion, StagingRegion, staging_slots

log = logging.getLogger(__name__)

# Between completion polls while operations are in flight, seconds.
POLL_INTERVAL_S = 0.001
# With nothing in flight: how often the worker looks at the sessions anyway.
IDLE_INTERVAL_S = 0.05
# While rows wait to be settled: how often the peer is asked whether it answers.
PROBE_INTERVAL_S = 0.2
# After the first gap in a request's keys, at most this many more lookup
# calls resolve the keys after it; keys still unresolved count as absent.
EXTRA_LOOKUP_CALLS = 3
_TRANSIENT_CODES = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "")


@dataclasses.dataclass(frozen=True)
class Job:
    """A store (is_load False) or load of vLLM rows ``chunk_ids``; ``keys``
    are vLLM's OffloadKeys, ``page_keys`` the peer's keys for them."""

    job_id: int
    is_load: bool
    keys: tuple
    page_keys: tuple
    chunk_ids: tuple


@dataclasses.dataclass(frozen=True)
class Outcome:
    job_id: int
    success: bool
    successful_keys: Optional[tuple] = None  # loads that partly failed: the keys that landed
    failed_keys: tuple = ()  # loads: keys the peer did not supply (now misses)
    seconds: float = 0.0
    nbytes: int = 0


@dataclasses.dataclass
class _Lane:
    region: Any
    session: Optional[Session] = None


@dataclasses.dataclass
class _JobState:
    """A job's rows: submitted in parts as the lane's region has room."""

    job: Job
    lane: _Lane
    started: float
    abandon_at: float  # rows not submitted by then fail
    oks: list  # per row: True / False, None while not ended
    next: int = 0  # first row not yet submitted
    open_parts: int = 0  # parts whose rows are still the peer's

    @property
    def done(self) -> bool:
        return self.next >= len(self.oks) and self.open_parts == 0


@dataclasses.dataclass
class _InFlight:
    """One operation: rows [lo, lo + len(blocks)) of a job."""

    state: _JobState
    lo: int
    op: Any  # None: the submission timed out, its id unknown
    blocks: list
    sent: float
    deadline_s: float
    answered_at: float = -1.0  # unsettled: when the peer first answered after it was sent

    @property
    def abandon_at(self) -> float:
        return self.sent + self.deadline_s

    @property
    def lane(self) -> _Lane:
        return self.state.lane

    @property
    def held(self) -> bool:
        """An unsettled store read from vLLM's pool: its job stays open."""
        return self.lane.region.zero_copy and not self.state.job.is_load


class Link:
    """Owns the peer connection and its worker thread (``start``/``close``)."""

    def __init__(self, cfg: TierConfig, layout: Layout, pool: Any, engine_id: str) -> None:
        self.cfg = cfg
        self.layout = layout
        self.pool = pool
        self.row_bytes = int(pool.shape[1])
        self.engine_id = engine_id
        self.commands: queue.SimpleQueue = queue.SimpleQueue()
        self.results: queue.SimpleQueue = queue.SimpleQueue()
        self._client: Optional[Client] = None
        self._jobs: list[_JobState] = []  # open jobs, in the order submitted
        self._inflight: list[_InFlight] = []
        self._unsettled: list[_InFlight] = []  # ended without an answer, rows held
        self._ok_at = -1.0  # when the peer last answered a call of this thread
        self._gone_at = -1.0  # when the peer was last seen gone (refused, session reopened)
        self._probed_at = -1.0
        self._thread = threading.Thread(target=self._run, name="orbitkv-vtier", daemon=True)
        self._closed = False
        self.store_lane, self.load_lane = self._lanes()

    # scheduler side -----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Stops the worker (its jobs end as failures), closes the sessions and
        removes the staging files. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self.commands.put(None)
        if self._thread.is_alive():
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.error("orbitkv tier: worker did not stop within %.1fs", timeout)
                return
        self._teardown()

    @property
    def mode(self) -> str:
        """How rows reach the peer: "zero-copy" (both ways), "zero-copy stores"
        or "staging"."""
        s, l = self.store_lane, self.load_lane
        if s is None or l is None:
            return "closed"
        if s.region.zero_copy and l.region.zero_copy:
            return "zero-copy"
        return "zero-copy stores" if s.region.zero_copy else "staging"

    @property
    def stores_zero_copy(self) -> bool:
        """Whether the peer reads stores from vLLM's pool in place."""
        return self.store_lane is not None and self.store_lane.region.zero_copy

    @property
    def load_slots(self) -> int:
        """Rows the load lane's region holds (staging slots, or the pool's)."""
        load = self.load_lane
        return load.region.num_blocks if load is not None else 0

    def state(self) -> dict:
        """What the scheduler side may ask about this worker (a worker process
        sends it to the tier whenever it changes: orbitkv.vllm_tier.worker)."""
        return {"ready": self.ready, "unsettled": len(self._unsettled), "mode": self.mode,
                "stores_zero_copy": self.stores_zero_copy, "load_slots": self.load_slots}

    def adopt(self, job: Job) -> None:
        """A store from vLLM's pool that a worker process before this one
        sent and could not see settled (it died): its rows stay pinned, as
        an unsettled store's do, until the peer answered after now and the
        store's deadline has passed since, or the peer is seen gone; then it
        ends as failed. Call before ``start``."""
        region = self.store_lane.region if self.stores_zero_copy else PoolRegion(self.pool)
        now, n = time.monotonic(), len(job.keys)
        st = _JobState(job, _Lane(region), now, now, [False] * n, next=n, open_parts=1)
        deadline_s = self.cfg.store_deadline_ms / 1000 + self.cfg.abandon_grace_s
        self._jobs.append(st)
        self._unsettled.append(_InFlight(st, 0, None, list(job.chunk_ids), now, deadline_s))

    @property
    def ready(self) -> bool:
        """Whether every lane's session is open and the peer reachable."""
        lanes = (self.store_lane, self.load_lane)
        return all(l is not None and l.session is not None and l.session.ready for l in lanes)

    def unsettled(self) -> int:
        """Jobs ended without an answer whose rows the peer may still touch."""
        return len(self._unsettled)

    # lanes and sessions ------------------------------------------------------------

    def _staging(self) -> StagingRegion:
        slots = staging_slots(self.cfg.staging_chunks, int(self.pool.shape[0]), self.row_bytes)
        return StagingRegion(self.pool, slots, self.cfg.staging_dir)

    def _lanes(self) -> tuple[_Lane, _Lane]:
        mode = self.cfg.zero_copy
        pool = PoolRegion.try_open(self.pool) if mode != "off" else None
        if mode == "on" and pool is None:
            raise ValueError("orbitkv tier: zero_copy is 'on' but vLLM's CPU pool is not a shared file")
        if pool is None:
            lane = _Lane(self._staging())
            return lane, lane
        if mode == "on":
            lane = _Lane(pool)
            return lane, lane
        return _Lane(pool), _Lane(self._staging())

    def _distinct_lanes(self) -> list[_Lane]:
        lanes = [self.store_lane, self.load_lane]
        return lanes[:1] if lanes[0] is lanes[1] else lanes

    def _open(self, lane: _Lane) -> None:
        r = lane.region
        try:
            lane.session = self._client.open_session(
                self.layout, block_tokens=self.layout.page_tokens, num_blocks=r.num_blocks, buffers=[r.buffer],
                segments=list(r.segments), engine_id=self.engine_id, lazy=True)
        except errors.OrbitKVError as e:  # refused for good (it cannot map the file, a row too big)
            log.warning("orbitkv tier: the peer refused a session (the tier stays off unless staging helps): %s", e)
            lane.session = None
            self._fall_back(lane, e)

    def _check_sessions(self) -> None:
        """A session over vLLM's pool that the peer refuses (it cannot open the
        pool's file: another /dev/shm) falls back to staging, once."""
        for lane in self._distinct_lanes():
            s = lane.session
            if not lane.region.zero_copy or s is None or s.ready or s.lost is None or s.lost.code in _TRANSIENT_CODES:
                continue
            if any(f.lane is lane for f in self._inflight + self._unsettled) or any(st.lane is lane for st in self._jobs):
                continue
            s.close()
            lane.session = None
            self._fall_back(lane, s.lost)

    def _fall_back(self, lane: _Lane, why: Exception) -> None:
        if not lane.region.zero_copy or self.cfg.zero_copy == "on":
            return
        log.warning("orbitkv tier: the peer cannot map vLLM's CPU pool (%s); staging stores too (one copy) in %s",
                    why, self.cfg.staging_dir)
        if self.load_lane is not lane and not self.load_lane.region.zero_copy:
            self.store_lane = self.load_lane  # share the load lane's staging
            lane.region.close()
            return
        lane.region = self._staging()
        self._open(lane)

    # the worker -------------------------------------------------------------------

    def _run(self) -> None:
        self._client = Client(self.cfg.socket, timeout=self.cfg.rpc_timeout_s,
                              connect_timeout=self.cfg.connect_timeout_s, lazy=True)
        for lane in self._distinct_lanes():
            try:
                self._open(lane)
            except Exception:  # e.g. the staging file cannot be made: the lane stays closed (misses)
                log.exception("orbitkv tier: opening a lane failed; it stays closed and its jobs end as misses")
        while True:
            busy = self._inflight or self._unsettled or self._jobs
            try:
                cmd = self.commands.get(timeout=POLL_INTERVAL_S if busy else IDLE_INTERVAL_S)
            except queue.Empty:
                cmd = ()
            while cmd not in ((), None):
                self._handle(cmd)
                try:
                    cmd = self.commands.get_nowait()
                except queue.Empty:
                    cmd = ()
            if cmd is None:
                break
            try:
                self._poll()
                self._settle()
                self._check_sessions()
            except Exception:  # a bug here must not leave vLLM waiting on jobs forever
                log.exception("orbitkv tier: worker round failed")
                self._give_up_abandoned()
        self._drain_on_stop()

    def _handle(self, cmd: tuple) -> None:
        kind, body = cmd
        try:
            if kind == "lookup":
                self.results.put(("lookup", self._lookup(body)))
            else:
                self._submit(body)
        except Exception:  # never let one command end the worker: answer it as a miss
            log.exception("orbitkv tier: %s failed", kind)
            if kind == "lookup":
                self.results.put(("lookup", [(p.key, p.generation, False) for p, _ in body]))
            else:  # answered once: parts still out end without finishing it again
                self._jobs = [st for st in self._jobs if st.job is not body]
                self._finish(body, False, [], 0.0)

    def _note(self, e: Optional[Exception] = None) -> None:
        """Records what a call said about the peer: answered, or gone."""
        if e is None or (isinstance(e, errors.OrbitKVError) and e.code not in _TRANSIENT_CODES):
            self._ok_at = time.monotonic()  # answered (maybe with an error)
        elif isinstance(e, errors.PeerUnavailable):
            self._gone_at = time.monotonic()

    # lookups ------------------------------------------------------------------------

    def _lookup(self, probes: Sequence[tuple]) -> list[tuple]:
        """probes: (Probe, page key), grouped by request in the order asked.
        Returns (key, generation, found) for every probe."""
        by_req: dict[str, list] = {}
        for p, pk in probes:
            by_req.setdefault(p.req_id, []).append((p, pk))
        out = []
        for group in by_req.values():
            found = self._present([pk for _, pk in group])
            out.extend((p.key, p.generation, f) for (p, _), f in zip(group, found))
        return out

    def _present(self, pks: list) -> list:
        """Which of ``pks`` the peer holds (absent when it cannot say)."""
        found = [False] * len(pks)
        s = next((l.session for l in (self.load_lane, self.store_lane) if l.session is not None and l.session.ready),
                 None)
        if s is None:
            return found
        start, extra = 0, 0
        step = self.cfg.max_keys_per_lookup
        while start < len(pks) and extra <= EXTRA_LOOKUP_CALLS:
            part = pks[start:start + step]
            try:
                hit = s.lookup(part).hit_pages
            except errors.OrbitKVError as e:
                self._note(e)
                log.debug("orbitkv tier: lookup failed: %s", e)
                return found
            self._note()
            for i in range(hit):
                found[start + i] = True
            if hit < len(part):
                extra += 1  # key start+hit is absent; resolve the ones after it
                start += hit + 1
            else:
                start += len(part)
        return found

    # jobs ----------------------------------------------------------------------------

    def _submit(self, job: Job) -> None:
        lane = self.load_lane if job.is_load else self.store_lane
        if lane.session is None or not lane.session.ready:
            self._finish(job, False, [], 0.0)
            return
        deadline_ms = self.cfg.load_deadline_ms if job.is_load else self.cfg.store_deadline_ms
        now = time.monotonic()
        st = _JobState(job, lane, now, now + deadline_ms / 1000 + self.cfg.abandon_grace_s, [None] * len(job.keys))
        self._jobs.append(st)
        self._advance(st)

    def _advance(self, st: _JobState) -> None:
        """Submits as many of the job's remaining rows as its region has room
        for; at its abandon time the rows still waiting fail."""
        job, n = st.job, len(st.oks)
        while st.next < n:
            s = st.lane.session
            if s is None or not s.ready:  # the peer is gone: nothing to wait for
                st.oks[st.next:] = [False] * (n - st.next)
                st.next = n
                break
            room = st.lane.region.available()
            if room <= 0:
                break
            lo, hi = st.next, min(n, st.next + room)
            st.next = hi
            self._send(st, lo, hi)
        if st.next < n and time.monotonic() >= st.abandon_at:
            st.oks[st.next:] = [False] * (n - st.next)
            st.next = n
        if st.done and st in self._jobs:
            self._jobs.remove(st)
            self._finish(job, all(st.oks), st.oks, time.monotonic() - st.started)

    def _send(self, st: _JobState, lo: int, hi: int) -> None:
        job, lane = st.job, st.lane
        r, s = lane.region, lane.session
        ids = job.chunk_ids[lo:hi]
        blocks = r.for_load(ids) if job.is_load else r.for_store(ids)
        refs = [PageRef(pk, (b,)) for pk, b in zip(job.page_keys[lo:hi], blocks)]
        deadline_ms = self.cfg.load_deadline_ms if job.is_load else self.cfg.store_deadline_ms
        f = _InFlight(st, lo, None, blocks, time.monotonic(), deadline_ms / 1000 + self.cfg.abandon_grace_s)
        st.open_parts += 1
        try:
            if job.is_load:
                f.op = s.load(refs, deadline_ms=deadline_ms)
            else:
                durability = Durability.SSD if self.cfg.durability == "ssd" else Durability.DRAM
                f.op = s.save(refs, durability=durability, deadline_ms=deadline_ms)
        except errors.OrbitKVError as e:
            self._note(e)
            log.debug("orbitkv tier: %s of %d pages failed: %s", "load" if job.is_load else "store", len(refs), e)
            if isinstance(e, errors.PeerTimeout):  # taken or not: unknown
                self._inflight.append(f)
            else:
                self._end(f, None, settled=True)
            return
        self._note()
        self._inflight.append(f)

    def _poll(self) -> None:
        """Ends the operations that are done, gone or abandoned."""
        still: list[_InFlight] = []
        unresponsive = False
        for f in self._inflight:
            now = time.monotonic()
            sid = f.lane.session.id if f.lane.session is not None else ""
            if f.op is not None and f.op.session_id != sid:
                self._gone_at = now  # the session was reopened: the peer restarted
                self._end(f, None, settled=True)
                continue
            if f.op is None or unresponsive:
                still.append(f) if now < f.abandon_at else self._end(f, None, settled=False)
                continue
            try:
                res = f.op.poll()
            except errors.OrbitKVError as e:
                self._note(e)
                if isinstance(e, errors.PeerTimeout):
                    unresponsive = True  # the others wait for the next round
                    still.append(f) if now < f.abandon_at else self._end(f, None, settled=False)
                else:  # refused (peer down), op or session unknown (it restarted)
                    self._end(f, None, settled=True)
                continue
            self._note()
            if res.done:
                self._end(f, res, settled=True)
            elif now >= f.abandon_at:
                self._end(f, None, settled=False)
            else:
                still.append(f)
        self._inflight = still
        for st in list(self._jobs):  # rows waiting for room
            if st.next < len(st.oks):
                self._advance(st)

    def _end(self, f: _InFlight, res: Any, settled: bool) -> None:
        st, n = f.state, len(f.blocks)
        oks = [p.ok for p in res.pages] if res is not None else [False] * n
        if len(oks) != n:
            oks = [False] * n
        if st.job.is_load and any(oks):
            good = [i for i, ok in enumerate(oks) if ok]
            ids = st.job.chunk_ids[f.lo:f.lo + n]
            f.lane.region.finish_load([f.blocks[i] for i in good], [ids[i] for i in good])
        st.oks[f.lo:f.lo + n] = oks
        if not settled:
            # The peer may still run it: its rows wait (_settle). A store from
            # vLLM's pool keeps its job open meanwhile; anything else ends.
            self._unsettled.append(f)
            if f.held:
                return
        else:
            f.lane.region.free(f.blocks)
        self._part_ended(st)

    def _part_ended(self, st: _JobState) -> None:
        st.open_parts -= 1
        if st.done and st in self._jobs:
            self._jobs.remove(st)
            self._finish(st.job, all(st.oks), st.oks, time.monotonic() - st.started)

    def _probe(self) -> None:
        """One cheap call (a keepalive) to learn whether the peer answers now,
        or is gone; at most once per PROBE_INTERVAL_S, only while rows wait."""
        now = time.monotonic()
        if now - self._probed_at < PROBE_INTERVAL_S:
            return
        self._probed_at = now
        lane = next((l for l in self._distinct_lanes() if l.session is not None and l.session.id), None)
        if lane is None:
            return
        try:
            self._client.call("probe", "Keepalive", engine_pb2.KeepaliveRequest(session_id=lane.session.id))
            self._note()
        except errors.NotFound:  # the session is unknown: the peer restarted
            self._note()
            self._gone_at = time.monotonic()
        except errors.OrbitKVError as e:
            self._note(e)

    def _settle(self) -> None:
        """Releases the rows of unsettled jobs once their operations cannot run."""
        if not self._unsettled:
            return
        self._probe()
        now = time.monotonic()
        keep = []
        for f in self._unsettled:
            reopened = f.op is not None and f.lane.session is not None and f.op.session_id != f.lane.session.id
            gone = reopened or self._gone_at >= f.sent
            if f.answered_at < 0 and self._ok_at >= f.sent:
                f.answered_at = self._ok_at  # the first answer after it was sent
            answered_then_ended = f.answered_at >= 0 and now >= f.answered_at + f.deadline_s
            if gone or answered_then_ended:
                f.lane.region.free(f.blocks)
                if f.held:
                    self._part_ended(f.state)
            else:
                keep.append(f)
        self._unsettled = keep

    def _finish(self, job: Job, success: bool, oks: Sequence[bool], seconds: float) -> None:
        if success or not job.is_load:
            n = len(job.keys) if success else 0
            self.results.put(("job", Outcome(job.job_id, success, None, (), seconds, n * self.row_bytes)))
            return
        ok = [k for k, good in zip(job.keys, oks) if good]
        bad = tuple(k for i, k in enumerate(job.keys) if i >= len(oks) or not oks[i])
        self.results.put(("job", Outcome(job.job_id, False, tuple(ok) or None, bad, seconds,
                                         len(ok) * self.row_bytes)))

    def _give_up_abandoned(self) -> None:
        """After a failed round: operations past their abandon time end
        unsettled, and jobs past theirs stop waiting for room."""
        now = time.monotonic()
        keep = []
        for f in self._inflight:
            if now >= f.abandon_at:
                with contextlib.suppress(Exception):
                    self._end(f, None, settled=False)
            else:
                keep.append(f)
        self._inflight = keep
        for st in list(self._jobs):
            with contextlib.suppress(Exception):
                self._advance(st)

    def _drain_on_stop(self) -> None:
        """Stopping: queued commands are answered as failures; operations in
        flight are waited for until their abandon time; jobs still open end
        (vLLM is shutting down: its pool goes, and a held store only reads it)."""
        while True:
            try:
                cmd = self.commands.get_nowait()
            except queue.Empty:
                break
            if cmd is not None:
                kind, body = cmd
                if kind == "lookup":
                    self.results.put(("lookup", [(p.key, p.generation, False) for p, _ in body]))
                else:
                    self._finish(body, False, [], 0.0)
        for st in self._jobs:  # rows not yet sent will not be
            st.oks[st.next:] = [False] * (len(st.oks) - st.next)
            st.next = len(st.oks)
        while self._inflight:
            self._poll()
            if self._inflight:
                time.sleep(POLL_INTERVAL_S)
        for st in self._jobs:
            self._finish(st.job, False, [False] * len(st.oks), 0.0)
        self._jobs, self._unsettled = [], []

    def _teardown(self) -> None:
        if self._client is not None:
            self._client.close()
        for lane in self._distinct_lanes():
            lane.region.close()
        # Drop every view of vLLM's pool: vLLM unmaps it after the tiers shut
        # down, and an exported buffer would keep the mapping alive.
        self.store_lane = self.load_lane = self.pool = None
