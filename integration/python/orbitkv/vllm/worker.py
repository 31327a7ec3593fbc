"""The connector's worker half (runs in every vLLM worker process).

Registers the paged KV tensors with the peer (one session per worker),
starts the loads and saves the scheduler planned, and reports completions:
finished_recving for async loads, finished_sending for finished requests
whose saves are done, and the block ids of pages that failed to load.

Operations are waited on by a small pool of threads (owned here, joined on
shutdown); vLLM's step only reads their results. A load or save that does
not finish by its deadline plus a grace period counts as failed.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import threading
from typing import Any, Mapping, Optional, Sequence

from orbitkv import buffers, errors
from orbitkv.client import Client, DTYPE_BYTES, Durability, Op, OpResult, PageRef, Session
from orbitkv.keys import Layout
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.metadata import LoadSpec, OrbitKVMetadata, PageSpan, SaveSpec

log = logging.getLogger(__name__)

_GRACE_S = 2.0


@dataclasses.dataclass
class _LoadState:
    spec: LoadSpec
    future: cf.Future


def _refs(span: PageSpan, rank: int) -> list[PageRef]:
    ks = span.keys[rank]
    return [PageRef(k, b) for k, b in zip(ks, span.blocks)]


class WorkerHalf:
    def __init__(self, cfg: ConnectorConfig, tp_rank: int) -> None:
        self.cfg = cfg
        self.rank = tp_rank
        self.layout: Layout = cfg.layout.with_rank(tp_rank)
        self.client: Optional[Client] = None
        self.session: Optional[Session] = None
        # Loads are latency-critical: they never queue behind saves.
        self._load_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="orbitkv-load")
        self._save_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="orbitkv-save")
        self._lock = threading.Lock()
        self._loads: dict[str, _LoadState] = {}
        self._saves: dict[str, list[cf.Future]] = {}
        self._finishing: set[str] = set()
        self._load_errors: set[int] = set()
        self._closed = False

    # --- registration ----------------------------------------------------------

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        self.register_planes(buffers.vllm_planes(kv_caches, self.cfg.kv_layout))

    def register_planes(self, planes: Sequence[Sequence[Any]]) -> None:
        """Registers per-layer (K, V) block-major planes (any engine)."""
        desc = buffers.describe_planes(planes)
        self._check(desc)
        self.client = Client(self.cfg.socket, timeout=self.cfg.timeout_s)
        self.session = self.client.open_session(
            self.layout,
            block_tokens=self.cfg.block_tokens,
            num_blocks=desc.num_blocks,
            buffers=desc.buffers,
            segments=desc.segments,
            engine_id=f"{self.cfg.engine_id}-tp{self.rank}",
        )
        log.info("orbitkv session %s: %d blocks, page %d bytes", self.session.id, desc.num_blocks, self.session.info.page_bytes)

    def _check(self, desc: buffers.KVDescription) -> None:
        lay = self.layout
        want_block = self.cfg.block_tokens * lay.kv_heads * lay.head_dim * DTYPE_BYTES.get(lay.dtype, 0)
        problems = []
        if len(desc.segments) != 2 * lay.num_layers:
            problems.append(f"{len(desc.segments) // 2} layers, layout says {lay.num_layers}")
        if desc.dtype != lay.dtype:
            problems.append(f"dtype {desc.dtype}, layout says {lay.dtype}")
        if any(s.block_bytes != want_block for s in desc.segments):
            problems.append(f"block bytes {desc.segments[0].block_bytes}, layout implies {want_block}")
        if problems:
            raise errors.BufferError_("KV tensors do not match the declared layout: " + "; ".join(problems))

    # --- per step ----------------------------------------------------------------

    def start_load_kv(self, meta: OrbitKVMetadata) -> None:
        for spec in meta.loads:
            fut = self._load_pool.submit(self._run_load, spec)
            with self._lock:
                self._loads[spec.req_id] = _LoadState(spec, fut)
        for spec in meta.loads:
            if spec.sync:
                self._loads[spec.req_id].future.result()

    def wait_for_save(self, meta: OrbitKVMetadata) -> None:
        """Starts the planned saves. It does not block: saved pages are whole
        prompt pages, which vLLM never rewrites while the request lives, and
        the blocks of a finished request stay allocated until its saves are
        reported (delayed free); preemption flushes them first."""
        for spec in meta.saves:
            fut = self._save_pool.submit(self._run_save, spec)
            with self._lock:
                self._saves.setdefault(spec.req_id, []).append(fut)

    def handle_preemptions(self, req_ids: Sequence[str]) -> None:
        with self._lock:
            futs = [f for r in req_ids for f in self._saves.get(str(r), ())]
        cf.wait(futs)

    def get_results(self, finished_req_ids: Sequence[str]) -> tuple[set[str], set[str], set[str]]:
        """(finished_sending, finished_recving, failed_recving)."""
        sending, recving, failed = set(), set(), set()
        with self._lock:
            for r in finished_req_ids:
                if str(r) in self._saves:
                    self._finishing.add(str(r))
            for r in list(self._finishing):
                if all(f.done() for f in self._saves[r]):
                    sending.add(r)
                    self._finishing.discard(r)
                    del self._saves[r]
            for r, st in list(self._loads.items()):
                if not st.future.done():
                    continue
                del self._loads[r]
                res: OpResult = st.future.result()
                bad = res.failed_indices() if res.pages else range(len(st.spec.blocks))
                for i in bad:
                    self._load_errors.update(st.spec.blocks[i])
                if bad:
                    failed.add(r)
                if not st.spec.sync:
                    recving.add(r)
        return sending, recving, failed

    def get_block_ids_with_load_errors(self) -> set[int]:
        with self._lock:
            out, self._load_errors = self._load_errors, set()
        return out

    # --- operations (pool threads) ---------------------------------------------------

    def _run_load(self, spec: LoadSpec) -> OpResult:
        assert self.session is not None, "register_kv_caches was not called"
        refs = _refs(spec, self.rank)
        lease = spec.leases.get(self.rank, "")
        try:
            try:
                op = self.session.load(refs, lease_id=lease, deadline_ms=self.cfg.load_deadline_ms)
            except (errors.NotFound, errors.InvalidRequest, errors.FailedPrecondition) as e:
                if not lease:
                    raise
                log.info("load with lease %s refused (%s); retrying without it", lease, e)
                op = self.session.load(refs, deadline_ms=self.cfg.load_deadline_ms)
            return self._wait(op, self.cfg.load_deadline_ms)
        except errors.OrbitKVError as e:
            log.warning("orbitkv load for %s failed, recomputing: %s", spec.req_id, e)
            return OpResult("", True, ())

    def _run_save(self, spec: SaveSpec) -> OpResult:
        assert self.session is not None, "register_kv_caches was not called"
        dur = Durability.SSD if self.cfg.durability == "ssd" else Durability.DRAM
        try:
            op = self.session.save(_refs(spec, self.rank), durability=dur, deadline_ms=self.cfg.save_deadline_ms)
            res = self._wait(op, self.cfg.save_deadline_ms)
            if not res.ok:
                log.info("orbitkv save for %s: %d of %d pages not saved", spec.req_id, len(res.failed_indices()), len(spec))
            return res
        except errors.OrbitKVError as e:
            log.warning("orbitkv save for %s failed: %s", spec.req_id, e)
            return OpResult("", True, ())

    def _wait(self, op: Op, deadline_ms: int) -> OpResult:
        res = op.wait(deadline_ms / 1000.0 + _GRACE_S)
        if not res.done:
            log.warning("orbitkv %s %s not done after its deadline; treating as failed", op.kind, op.op_id)
        return res

    def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._load_pool.shutdown(wait=True)
        self._save_pool.shutdown(wait=True)
        if self.client is not None:
            self.client.close()
