"""OrbitKVTier: vLLM's SecondaryTierManager backed by the host's OrbitKV peer.

vLLM calls every method on its scheduler process, under its tiering
manager's lock, and expects each to return at once. This class only moves
state between vLLM and the worker (orbitkv.vllm_tier.link): lookups become
probes sent once per step, jobs become commands, and the worker's answers
are picked up when vLLM next asks (``lookup``, ``get_finished_jobs``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Iterable
from typing import Any, ClassVar

from vllm.v1.kv_offload.base import (
    Locality,
    LookupResult,
    Medium,
    OffloadKey,
    OffloadPolicy,
    ReqContext,
    RequestOffloadingContext,
    ScheduleEndContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager, TransferJob
from vllm.v1.metrics.cache_hit_source import CacheHitSource

from orbitkv.vllm_tier.config import TierConfig
from orbitkv.vllm_tier.link import Job, Link
from orbitkv.vllm_tier.pagekeys import RowFormat, page_key
from orbitkv.vllm_tier.staging import pool_array
from orbitkv.vllm_tier.verdicts import Verdicts
from orbitkv.vllm_tier.worker import ProcessLink, WorkerUnavailable

log = logging.getLogger(__name__)

# How long shutdown waits for the worker, beyond the longest job deadline.
_SHUTDOWN_SLACK_S = 5.0
# While drain_jobs waits on a peer that does not answer: how often it says so.
_DRAIN_WARN_S = 5.0


class OrbitKVTier(SecondaryTierManager):
    """``{"type": "OrbitKVTier", "module_path": "orbitkv.vllm_tier", "socket": …}``
    in ``secondary_tiers`` (orbitkv.vllm_tier.config lists the keys)."""

    medium: ClassVar[Medium] = Medium.CPU
    # One class-wide source cannot say whether the peer served a page from its
    # DRAM, its SSD or another host: counted as external, not as vLLM's host pool.
    cache_hit_source: ClassVar[CacheHitSource] = CacheHitSource.EXTERNAL_UNSPECIFIED

    def __init__(self, offloading_spec: Any, primary_kv_view: memoryview, tier_type: str,
                 backpressure_detector: Any = None, **options: Any) -> None:
        super().__init__(offloading_spec, primary_kv_view, tier_type, backpressure_detector)
        self.cfg = TierConfig.from_options(options)
        self.locality = Locality(self.cfg.locality)
        pool = pool_array(primary_kv_view)
        self.format = RowFormat.from_spec(offloading_spec, pool.shape[1])
        self.layout = self.format.layout(self.cfg.revision)
        self.fp = self.layout.fingerprint()
        engine_id = self.cfg.engine_id or f"vllm-tier-{getattr(offloading_spec.config, 'engine_id', '')}"
        self._verdicts = Verdicts(self.cfg.lookup_refresh_s)
        self._page_keys: dict[bytes, bytes] = {}
        self._jobs_lock = threading.Condition()
        self._jobs_open = 0  # submitted, outcome not yet taken by get_finished_jobs
        self._finished: list[JobResult] = []
        self._link = self._make_link(pool, engine_id)
        self._link.start()
        log.info("orbitkv tier: peer %s, %s rows of %d bytes, %s, worker %s, layout %s (fingerprint %s)",
                 self.cfg.socket, pool.shape[0], pool.shape[1], self._link.mode,
                 "process" if isinstance(self._link, ProcessLink) else "thread", self.layout.byte_layout,
                 self.fp.hex())

    def _make_link(self, pool: Any, engine_id: str) -> Any:
        """The worker: a process of its own where vLLM's pool is a file it
        can map (orbitkv.vllm_tier.worker), else a thread in this process."""
        if self.cfg.worker != "thread":
            try:
                return ProcessLink(self.cfg, self.layout, pool, engine_id)
            except WorkerUnavailable as e:
                # Only its text travels on: the exception's frames hold vLLM's
                # pool, and a kept log record would keep them (vLLM could not
                # unmap its pool at shutdown).
                why = str(e)
                if self.cfg.worker == "process":
                    raise ValueError(f"orbitkv tier: worker is 'process' but {why}") from None
                log.warning("orbitkv tier: %s; the worker runs as a thread of vLLM's process", why)
        return Link(self.cfg, self.layout, pool, engine_id)

    # keys ------------------------------------------------------------------

    def _pk(self, key: OffloadKey) -> bytes:
        pk = self._page_keys.get(key)
        if pk is None:
            pk = page_key(self.fp, key)
            if len(self._page_keys) > 1 << 16:
                self._page_keys.clear()
            self._page_keys[key] = pk
        return pk

    # lookups -----------------------------------------------------------------

    def lookup(self, key: OffloadKey, req_context: ReqContext) -> LookupResult:
        self._take_results()
        found = self._verdicts.lookup(bytes(key), req_context.req_id, time.monotonic())
        if found is None:
            return LookupResult.RETRY
        return LookupResult.HIT if found else LookupResult.MISS

    def on_schedule_end(self, context: ScheduleEndContext) -> None:
        self._take_results()
        batch = self._verdicts.take_batch()
        if batch:
            self._link.commands.put(("lookup", [(p, self._pk(p.key)) for p in batch]))

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        # Request level: vLLM also stores to this tier the request's chunks
        # its CPU pool holds already (its prefix hits). vLLM cascades a chunk
        # to its secondary tiers only when it first stores it, and a hit in
        # its pool never reaches them, so without this the peer's LRU ages a
        # hot prefix out while the pool holds it, and has lost it by the time
        # the pool evicts it (H100, 2026-12-06: 0.13 M tokens served of an
        # 8 GiB peer). The peer answers a save of a page it holds at once,
        # marking it used, and copies back one it had dropped. Only while the
        # peer reads stores from vLLM's pool in place: a staged store would
        # copy every hit of every request into the staging region first.
        if self.cfg.request_level and self._link.stores_zero_copy:
            return RequestOffloadingContext(OffloadPolicy.REQUEST_LEVEL)
        return RequestOffloadingContext()

    def on_request_finished(self, req_context: ReqContext) -> None:
        self._verdicts.release(req_context.req_id)

    # jobs --------------------------------------------------------------------

    def submit_store(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=False)

    def submit_load(self, job_metadata: TransferJob) -> None:
        self._submit(job_metadata, is_load=True)

    def _submit(self, t: TransferJob, is_load: bool) -> None:
        keys = tuple(bytes(k) for k in t.keys)
        job = Job(t.job_id, is_load, keys, tuple(self._pk(k) for k in keys), tuple(int(c) for c in t.chunk_ids))
        with self._jobs_lock:
            self._jobs_open += 1
        self._link.commands.put(("job", job))

    def get_finished_jobs(self) -> Iterable[JobResult]:
        self._take_results()
        out, self._finished = self._finished, []
        if out:
            with self._jobs_lock:
                self._jobs_open -= len(out)
                self._jobs_lock.notify_all()
        return out

    def _take_results(self) -> None:
        """Applies the worker's answers (lookup results, finished jobs)."""
        now = time.monotonic()
        q = self._link.results
        while True:
            try:
                kind, body = q.get_nowait()
            except queue.Empty:
                return
            if kind == "lookup":
                for key, gen, found in body:
                    self._verdicts.resolve(key, gen, found, now)
                continue
            if body.failed_keys:
                self._verdicts.mark_miss(body.failed_keys, now)
            self._finished.append(JobResult(job_id=body.job_id, success=body.success,
                                            successful_keys=body.successful_keys,
                                            transfer_time=body.seconds, transfer_bytes=body.nbytes or None))
            with self._jobs_lock:
                self._jobs_lock.notify_all()

    def has_pending_work(self) -> bool:
        with self._jobs_lock:
            open_jobs = self._jobs_open
        return open_jobs > 0 or self._verdicts.probing > 0

    def drain_jobs(self) -> None:
        """Blocks until every submitted job has ended; their results wait for
        the next get_finished_jobs. A job ends by its deadline plus
        abandon_grace_s, except a store whose operation the peer may still run
        (it stopped answering): that one ends once the peer answers again or
        is gone (orbitkv.vllm_tier.link, "Slots"), and this waits for it, as
        vLLM's contract asks (reusing its rows could corrupt them)."""
        warn_at = time.monotonic() + self._longest_job_s()
        while True:
            self._take_results()
            with self._jobs_lock:
                running = self._jobs_open - len(self._finished)
                if running <= 0:
                    return
                if time.monotonic() > warn_at:
                    log.warning("orbitkv tier: waiting for %d jobs; the peer does not answer", running)
                    warn_at = time.monotonic() + _DRAIN_WARN_S
                self._jobs_lock.wait(0.01)

    def _longest_job_s(self) -> float:
        c = self.cfg
        return max(c.store_deadline_ms, c.load_deadline_ms) / 1000 + c.abandon_grace_s + c.rpc_timeout_s

    def shutdown(self) -> None:
        self._link.close(self._longest_job_s() + _SHUTDOWN_SLACK_S)

    @property
    def mode(self) -> str:
        """How rows reach the peer: "zero-copy stores" (the default: loads are
        staged), "zero-copy" (zero_copy "on") or "staging"."""
        return self._link.mode

    def config_info(self) -> dict:
        return {}


__all__ = ["OrbitKVTier"]
