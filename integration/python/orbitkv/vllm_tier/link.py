"""The tier's worker: the only thread that talks to the peer.

The scheduler thread (the tier's methods, under vLLM's manager lock) never
waits on the peer: it puts commands on ``commands`` (lookup probes, store
and load jobs) and takes answers from ``results``. This thread owns the
client, the session, the region the peer maps and every operation in flight.

Every call to the peer has a deadline (``rpc_timeout_s``), every operation a
peer-side deadline (``store_deadline_ms`` / ``load_deadline_ms``), and every
job an end: it finishes when the peer says its operation is done, when the
operation is known gone (the peer refused the connection, forgot the
operation or the session: it restarted), or, when the peer stops answering,
``abandon_grace_s`` after its deadline. Until then its CPU rows stay pinned
by vLLM (a store) or reserved for it (a load), so the peer never writes a row
vLLM reuses. A peer that is down, slow, restarting or full turns lookups
into "absent" and jobs into failures, never into errors for vLLM.
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Optional, Sequence

from orbitkv import errors
from orbitkv.client import Client, Durability, PageRef, Session
from orbitkv.keys import Layout
from orbitkv.vllm_tier.config import TierConfig
from orbitkv.vllm_tier.staging import PoolRegion, StagingRegion

log = logging.getLogger(__name__)

# Between completion polls while operations are in flight, seconds.
POLL_INTERVAL_S = 0.001
# With nothing in flight: how often the worker looks at the session anyway
# (a zero-copy open the peer refused falls back to staging).
IDLE_INTERVAL_S = 0.05
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
class _InFlight:
    job: Job
    op: Any
    blocks: list
    started: float
    abandon_at: float


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
        self._session: Optional[Session] = None
        self._region: Any = None
        self._inflight: list[_InFlight] = []
        self._thread = threading.Thread(target=self._run, name="orbitkv-vtier", daemon=True)
        self._closed = False
        self.region = self._first_region()

    # scheduler side -----------------------------------------------------------

    def start(self) -> None:
        self._thread.start()

    def close(self, timeout: float) -> None:
        """Stops the worker (its jobs end as failures), closes the session and
        removes the staging file. Idempotent."""
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
        region = self._region or self.region
        if region is None:
            return "closed"
        return "zero-copy" if region.zero_copy else "staging"

    # the worker -------------------------------------------------------------------

    def _first_region(self) -> Any:
        if self.cfg.zero_copy != "off":
            region = PoolRegion.try_open(self.pool)
            if region is not None:
                return region
            if self.cfg.zero_copy == "on":
                raise ValueError("orbitkv tier: zero_copy is 'on' but vLLM's CPU pool is not a shared file")
        return StagingRegion(self.pool, self.cfg.staging_chunks, self.cfg.staging_dir)

    def _open(self) -> None:
        self._region, self.region = self.region, None
        self._client = Client(self.cfg.socket, timeout=self.cfg.rpc_timeout_s,
                              connect_timeout=self.cfg.connect_timeout_s, lazy=True)
        self._session = self._open_session()

    def _open_session(self) -> Session:
        r = self._region
        return self._client.open_session(
            self.layout, block_tokens=self.layout.page_tokens, num_blocks=r.num_blocks, buffers=[r.buffer],
            segments=list(r.segments), engine_id=self.engine_id, lazy=True)

    def _run(self) -> None:
        try:
            self._open()
        except errors.OrbitKVError as e:
            self._fall_back(e)
        while True:
            wait = POLL_INTERVAL_S if self._inflight else IDLE_INTERVAL_S
            try:
                cmd = self.commands.get(timeout=wait)
            except queue.Empty:
                cmd = ()
            stop = False
            while cmd != () and not stop:
                if cmd is None:
                    stop = True
                    break
                self._handle(cmd)
                try:
                    cmd = self.commands.get_nowait()
                except queue.Empty:
                    cmd = ()
            if stop:
                break
            self._poll()
            self._check_session()
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
            else:
                self._finish(body, False, [], 0.0)

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
        s = self._session
        if s is None or not s.ready:
            return found
        start, extra = 0, 0
        step = self.cfg.max_keys_per_lookup
        while start < len(pks) and extra <= EXTRA_LOOKUP_CALLS:
            part = pks[start:start + step]
            try:
                hit = s.lookup(part).hit_pages
            except errors.OrbitKVError as e:
                log.debug("orbitkv tier: lookup failed: %s", e)
                return found
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
        s, r = self._session, self._region
        if s is None or r is None or not s.ready:
            self._finish(job, False, [], 0.0)
            return
        blocks = r.for_load(job.chunk_ids) if job.is_load else r.for_store(job.chunk_ids)
        if blocks is None:  # staging full: drop the store, miss the load
            self._finish(job, False, [], 0.0)
            return
        refs = [PageRef(pk, (b,)) for pk, b in zip(job.page_keys, blocks)]
        now = time.monotonic()
        try:
            if job.is_load:
                deadline = self.cfg.load_deadline_ms
                op = s.load(refs, deadline_ms=deadline)
            else:
                deadline = self.cfg.store_deadline_ms
                op = s.save(refs, durability=Durability.SSD if self.cfg.durability == "ssd" else Durability.DRAM,
                            deadline_ms=deadline)
        except errors.OrbitKVError as e:
            # PeerTimeout: the peer may have taken the operation without our
            # knowing its id; it ends by its deadline, the rows stay held till then.
            log.debug("orbitkv tier: %s of %d pages failed: %s", "load" if job.is_load else "store", len(refs), e)
            if isinstance(e, errors.PeerTimeout):
                self._inflight.append(_InFlight(job, None, blocks, now, now + deadline / 1000 + self.cfg.abandon_grace_s))
                return
            r.free(blocks)
            self._finish(job, False, [], 0.0)
            return
        self._inflight.append(_InFlight(job, op, blocks, now, now + deadline / 1000 + self.cfg.abandon_grace_s))

    def _poll(self) -> None:
        """Ends the jobs whose operations are done or gone."""
        still: list[_InFlight] = []
        unresponsive = False
        for f in self._inflight:
            now = time.monotonic()
            if f.op is None or unresponsive or f.op.session_id != self._session.id:
                gone = f.op is not None and f.op.session_id != self._session.id
                if gone or now >= f.abandon_at:
                    self._end(f, None)
                else:
                    still.append(f)
                continue
            try:
                res = f.op.poll()
            except errors.PeerTimeout:
                unresponsive = True  # the others wait for the next round
                (still.append(f) if now < f.abandon_at else self._end(f, None))
                continue
            except errors.OrbitKVError as e:  # refused (peer down), op or session unknown
                log.debug("orbitkv tier: job %d ended: %s", f.job.job_id, e)
                self._end(f, None)
                continue
            if res.done:
                self._end(f, res)
            elif now >= f.abandon_at:
                self._end(f, None)
            else:
                still.append(f)
        self._inflight = still

    def _end(self, f: _InFlight, res: Any) -> None:
        oks = [p.ok for p in res.pages] if res is not None else [False] * len(f.job.keys)
        if len(oks) != len(f.job.keys):
            oks = [False] * len(f.job.keys)
        if f.job.is_load:
            good = [i for i, ok in enumerate(oks) if ok]
            self._region.finish_load([f.blocks[i] for i in good], [f.job.chunk_ids[i] for i in good])
        self._region.free(f.blocks)
        self._finish(f.job, all(oks), oks, time.monotonic() - f.started)

    def _finish(self, job: Job, success: bool, oks: Sequence[bool], seconds: float) -> None:
        if success or not job.is_load:
            n = len(job.keys) if success else 0
            self.results.put(("job", Outcome(job.job_id, success, None, (), seconds, n * self.row_bytes)))
            return
        ok = [k for k, good in zip(job.keys, oks) if good]
        bad = tuple(k for i, k in enumerate(job.keys) if i >= len(oks) or not oks[i])
        self.results.put(("job", Outcome(job.job_id, False, tuple(ok) or None, bad, seconds,
                                         len(ok) * self.row_bytes)))

    # the session -----------------------------------------------------------------------

    def _check_session(self) -> None:
        """A zero-copy session the peer refuses (it cannot open vLLM's pool
        file: another /dev/shm) falls back to a staging region, once."""
        s = self._session
        if s is None or s.ready or s.lost is None or not self._region.zero_copy:
            return
        if s.lost.code in _TRANSIENT_CODES or self._inflight:
            return
        self._fall_back(s.lost)

    def _fall_back(self, why: Exception) -> None:
        if self._region is None or not self._region.zero_copy or self.cfg.zero_copy == "on":
            log.warning("orbitkv tier: cannot open a session with the peer: %s", why)
            return
        log.warning("orbitkv tier: the peer cannot map vLLM's CPU pool (%s); using a staging region "
                    "(one copy) in %s", why, self.cfg.staging_dir)
        if self._session is not None:
            self._session.close()
        self._region = StagingRegion(self.pool, self.cfg.staging_chunks, self.cfg.staging_dir)
        try:
            self._session = self._open_session()
        except errors.OrbitKVError as e:
            log.warning("orbitkv tier: cannot open a session with the peer: %s", e)

    def _drain_on_stop(self) -> None:
        """Stopping: queued commands are answered as failures; operations in
        flight are waited for until their own abandon time (a running copy
        must end before vLLM frees the rows)."""
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
        while self._inflight:
            self._poll()
            if self._inflight:
                time.sleep(POLL_INTERVAL_S)

    def _teardown(self) -> None:
        if self._client is not None:
            self._client.close()
        for r in (self._region, self.region):
            if r is not None:
                r.close()
        # Drop every view of vLLM's pool: vLLM unmaps it after the tiers shut
        # down, and an exported buffer would keep the mapping alive.
        self._region = self.region = self.pool = None
