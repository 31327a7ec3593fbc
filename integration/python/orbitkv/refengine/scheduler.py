"""Continuous-batching scheduler with prefix caching and vLLM's V1 KV-connector calls.

The order of calls into the scheduler half of a connector follows vLLM's Scheduler
(research/engine-apis.md §1.3): per waiting request on first admission, a local prefix-cache
lookup, then get_num_new_matched_tokens, allocation, update_state_after_alloc (also with 0
external tokens, and again after an async load completes); build_connector_meta once per step;
update_connector_output and the finished_sending / finished_recving / invalid-block bookkeeping
after the step; request_finished once per request before its blocks are freed.

One deliberate difference from vLLM: a block is published to the prefix cache only after the
step that filled it came back without a load error for it, so a failed external load can never
be served to another request from the local cache.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any, Deque, Dict, List, Optional, Set, Tuple

from .blocks import BlockPool
from .config import EngineConfig
from .connector import KVCacheBlock, KVCacheBlocks, KVConnectorOutput
from .request import Request, RequestStatus


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: List[int]
    block_ids: Tuple[List[int], ...]
    num_computed_tokens: int
    sampling_params: Any
    all_token_ids: List[int]


@dataclasses.dataclass
class CachedRequestData:
    req_ids: List[str] = dataclasses.field(default_factory=list)
    resumed_from_preemption: List[bool] = dataclasses.field(default_factory=list)
    new_token_ids: List[List[int]] = dataclasses.field(default_factory=list)
    new_block_ids: List[Optional[Tuple[List[int], ...]]] = dataclasses.field(default_factory=list)
    num_computed_tokens: List[int] = dataclasses.field(default_factory=list)
    num_output_tokens: List[int] = dataclasses.field(default_factory=list)

    @property
    def num_reqs(self) -> int:
        return len(self.req_ids)

    def add(self, req: Request, resumed: bool, new_block_ids: Optional[List[int]]) -> None:
        self.req_ids.append(req.request_id)
        self.resumed_from_preemption.append(resumed)
        self.new_token_ids.append(list(req.all_token_ids) if resumed else [])
        self.new_block_ids.append((new_block_ids,) if new_block_ids else None)
        self.num_computed_tokens.append(req.num_computed_tokens)
        self.num_output_tokens.append(req.num_output_tokens)

    @property
    def resumed_req_ids(self) -> Set[str]:
        return {r for r, x in zip(self.req_ids, self.resumed_from_preemption) if x}


@dataclasses.dataclass
class ScheduledSeq:
    """Engine-internal: one request's slice of a step."""

    request: Request
    start: int            # num_computed_tokens when scheduled (local + external included)
    num_tokens: int       # tokens computed this step
    block_ids: List[int]  # the request's blocks covering start + num_tokens
    ext_start: int = 0    # external tokens loaded this step: [ext_start, ext_start + ext)
    ext: int = 0

    @property
    def samples(self) -> bool:
        return self.start + self.num_tokens == self.request.num_tokens


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: List[NewRequestData]
    scheduled_cached_reqs: CachedRequestData
    num_scheduled_tokens: Dict[str, int]
    total_num_scheduled_tokens: int
    finished_req_ids: Set[str]
    preempted_req_ids: Set[str]
    seqs: List[ScheduledSeq]
    kv_connector_metadata: Any = None
    scheduled_spec_decode_tokens: Dict[str, List[int]] = dataclasses.field(default_factory=dict)
    num_common_prefix_blocks: Tuple[int, ...] = (0,)

    @property
    def has_sync_kv_loads(self) -> bool:
        return any(s.ext for s in self.seqs)


@dataclasses.dataclass
class SchedulerStats:
    steps: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    prefix_query_tokens: int = 0       # tokens looked up in the local prefix cache
    prefix_hit_tokens: int = 0         # of which hit
    external_query_tokens: int = 0     # tokens past the local hit offered to the connector
    external_matched_tokens: int = 0   # of which the connector claimed
    external_restored_tokens: int = 0  # of which arrived without a load error
    load_error_blocks: int = 0
    preemptions: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0


class Scheduler:
    """Waiting/running queues, block allocation and the connector's scheduler half."""

    def __init__(self, cfg: EngineConfig, connector: Any = None):
        self.cfg = cfg
        self.B = cfg.block_size
        self.pool = BlockPool(cfg.num_blocks, cfg.enable_prefix_caching)
        self.connector = connector
        self.requests: Dict[str, Request] = {}
        self.waiting: Deque[Request] = collections.deque()
        self.running: List[Request] = []
        self.req_blocks: Dict[str, List[int]] = {}
        self.cached_upto: Dict[str, int] = {}          # blocks of a request already published
        self.holds: Dict[str, Tuple[Set[str], List[int]]] = {}  # finished, blocks still held
        self.finished_recving: Set[str] = set()        # async loads done, not yet promoted
        self.failed_block: Dict[str, int] = {}         # async load: first failed block index
        self.finished_since_step: Set[str] = set()
        self.stats = SchedulerStats()

    # -- requests -------------------------------------------------------------------------
    def add_request(self, req: Request) -> None:
        if cdiv(req.num_prompt_tokens + req.max_tokens, self.B) > self.pool.num_blocks:
            raise ValueError(f"prompt {req.num_prompt_tokens} + max_tokens {req.max_tokens} tokens "
                             f"exceed the KV pool ({self.pool.num_blocks * self.B} tokens)")
        if req.request_id in self.requests or req.request_id in self.holds:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        self.requests[req.request_id] = req
        self.waiting.append(req)
        self.stats.prompt_tokens += req.num_prompt_tokens

    def abort(self, request_id: str) -> Optional[Request]:
        req = self.requests.get(request_id)
        if req is None or req.status.finished:
            return None
        self._finish(req, RequestStatus.FINISHED_ABORTED)
        self.stats.requests_aborted += 1
        return req

    def has_work(self) -> bool:
        """Requests to run, blocks held for transfers, or finished ids the workers have not
        been told yet (as vLLM's has_requests: one more step delivers finished_req_ids)."""
        return bool(self.waiting or self.running or self.holds or self.finished_since_step)

    # -- schedule -------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        budget = self.cfg.max_batched_tokens
        seqs: List[ScheduledSeq] = []
        new_reqs: List[NewRequestData] = []
        cached = CachedRequestData()
        preempted: Set[str] = set()
        budget = self._schedule_running(budget, seqs, cached, preempted)
        if not preempted:
            self._schedule_waiting(budget, seqs, new_reqs, cached)
        so = SchedulerOutput(
            scheduled_new_reqs=new_reqs, scheduled_cached_reqs=cached,
            num_scheduled_tokens={s.request.request_id: s.num_tokens for s in seqs},
            total_num_scheduled_tokens=sum(s.num_tokens for s in seqs),
            finished_req_ids=self.finished_since_step, preempted_req_ids=preempted, seqs=seqs)
        self.finished_since_step = set()
        if self.connector is not None:
            so.kv_connector_metadata = self.connector.build_connector_meta(so)
        for s in seqs:  # vLLM's _update_after_schedule
            s.request.num_computed_tokens += s.num_tokens
        self.stats.steps += 1
        return so

    def _schedule_running(self, budget, seqs, cached, preempted) -> int:
        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            n = min(req.num_tokens - req.num_computed_tokens, budget)
            had = len(self.req_blocks[req.request_id])
            while not self._grow(req, req.num_computed_tokens + n):
                victim = self.running.pop()
                self._preempt(victim)
                preempted.add(victim.request_id)
                if victim is req:
                    return budget
            blocks = self.req_blocks[req.request_id]
            seqs.append(ScheduledSeq(req, req.num_computed_tokens, n, list(blocks)))
            cached.add(req, False, blocks[had:])
            budget -= n
            i += 1
        return budget

    def _schedule_waiting(self, budget, seqs, new_reqs, cached) -> None:
        skipped: List[Request] = []
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            req = self.waiting[0]
            if req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and not self._promote_loaded(req):
                skipped.append(self.waiting.popleft())
                continue
            fresh = req.request_id not in self.req_blocks
            hit: List[int] = []
            ext, load_async = 0, False
            computed = req.num_computed_tokens
            if fresh:
                hit = self.pool.cached_prefix(req.block_hashes[:(req.num_tokens - 1) // self.B])
                computed = len(hit) * self.B
                if self.connector is not None:
                    ext, load_async = self.connector.get_num_new_matched_tokens(req, computed)
                    if ext is None:  # not known yet: ask again next step
                        skipped.append(self.waiting.popleft())
                        continue
                    ext = int(ext)
                    load_async = bool(load_async) and ext > 0
            if load_async:
                start, n = computed, 0
                target = computed + ext
            else:
                start = min(computed + ext, req.num_tokens - 1)
                n = min(req.num_tokens - start, budget)
                target = max(computed + ext, start + n)
            if not self._admit_blocks(req, hit, target):
                break  # as vLLM: the head of the queue waits for blocks
            self.waiting.popleft()
            if fresh:
                self._count_admission(req, computed, ext)
                req.local_hit_tokens = computed
                if req.num_cached_tokens < 0:  # set once, as vLLM: a readmission after a
                    req.num_cached_tokens = computed  # preemption hits the request's own blocks
            req.num_external_computed_tokens = ext
            if self.connector is not None:
                self.connector.update_state_after_alloc(req, self._kv_blocks(req), ext)
            if load_async:
                req.status = RequestStatus.WAITING_FOR_REMOTE_KVS
                skipped.append(req)
                continue
            self._start_running(req, start, n, computed, ext, seqs, new_reqs, cached)
            budget -= n
        self.waiting.extendleft(reversed(skipped))

    def _start_running(self, req, start, n, computed, ext, seqs, new_reqs, cached) -> None:
        resumed = req.status == RequestStatus.PREEMPTED
        req.status = RequestStatus.RUNNING
        req.num_computed_tokens = start
        self.running.append(req)
        blocks = self.req_blocks[req.request_id]
        seqs.append(ScheduledSeq(req, start, n, list(blocks), ext_start=computed, ext=ext))
        if resumed:
            cached.add(req, True, list(blocks))
        else:
            new_reqs.append(NewRequestData(req.request_id, list(req.prompt_token_ids), (list(blocks),),
                                           start, req.sampling_params, list(req.all_token_ids)))

    def _count_admission(self, req: Request, local: int, ext: int) -> None:
        st = self.stats
        st.prefix_query_tokens += req.num_tokens
        st.prefix_hit_tokens += local
        if self.connector is not None:
            st.external_query_tokens += req.num_tokens - local
            st.external_matched_tokens += ext

    def _promote_loaded(self, req: Request) -> bool:
        """An async load reported done: compute from the loaded blocks (vLLM semantics)."""
        rid = req.request_id
        if rid not in self.finished_recving:
            return False
        self.finished_recving.discard(rid)
        n = min(len(self.req_blocks[rid]) * self.B, req.num_tokens)
        if n == req.num_tokens:
            n -= 1
        bad = self.failed_block.pop(rid, None)
        if bad is not None:
            n = min(n, bad * self.B)
        n = max(n, req.local_hit_tokens)
        self._restored(req, n - req.local_hit_tokens)
        req.num_computed_tokens = n
        req.status = RequestStatus.WAITING
        self._publish(req)
        return True

    # -- blocks ---------------------------------------------------------------------------
    def _grow(self, req: Request, tokens: int) -> bool:
        blocks = self.req_blocks[req.request_id]
        need = cdiv(tokens, self.B) - len(blocks)
        if need <= 0:
            return True
        new = self.pool.allocate(need)
        if new is None:
            return False
        blocks.extend(new)
        return True

    def _admit_blocks(self, req: Request, hit: List[int], tokens: int) -> bool:
        if req.request_id in self.req_blocks:
            return self._grow(req, tokens)
        need = cdiv(tokens, self.B) - len(hit)
        if need > self.pool.num_free_after_touch(hit):
            return False
        self.pool.touch(hit)
        self.req_blocks[req.request_id] = list(hit) + (self.pool.allocate(max(need, 0)) or [])
        self.cached_upto[req.request_id] = len(hit)
        return True

    def _kv_blocks(self, req: Request) -> KVCacheBlocks:
        return KVCacheBlocks([KVCacheBlock(b, self.pool.block_hash[b]) for b in self.req_blocks[req.request_id]])

    def _publish(self, req: Request) -> None:
        """Cache the request's blocks that are full of computed tokens."""
        rid = req.request_id
        blocks = self.req_blocks[rid]
        upto = min(req.num_computed_tokens // self.B, len(req.block_hashes), len(blocks))
        for i in range(self.cached_upto.get(rid, 0), upto):
            self.pool.cache(blocks[i], req.block_hashes[i])
        self.cached_upto[rid] = max(upto, self.cached_upto.get(rid, 0))

    def _release(self, rid: str) -> List[int]:
        self.cached_upto.pop(rid, None)
        return self.req_blocks.pop(rid, [])

    def _free(self, blocks: List[int]) -> None:
        self.pool.release(list(reversed(blocks)))  # tail blocks are evicted first

    def _preempt(self, req: Request) -> None:
        self._free(self._release(req.request_id))
        req.status = RequestStatus.PREEMPTED
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.waiting.appendleft(req)
        self.stats.preemptions += 1

    def _restored(self, req: Request, n: int) -> None:
        if n > 0:
            req.restored_tokens += n
            if not req.num_preemptions:
                req.first_restored_tokens += n
            self.stats.external_restored_tokens += n

    # -- after the step -------------------------------------------------------------------
    def update_from_output(self, so: SchedulerOutput, sampled: Dict[str, int],
                           kvo: Optional[KVConnectorOutput]) -> List[Request]:
        """Apply a step's results; returns requests that got a token or finished."""
        kvo = kvo or KVConnectorOutput()
        skip = self._handle_invalid_blocks(so, kvo.invalid_block_ids) if kvo.invalid_block_ids else set()
        if self.connector is not None and hasattr(self.connector, "update_connector_output"):
            self.connector.update_connector_output(kvo)
        changed: List[Request] = []
        for s in so.seqs:
            req = s.request
            if req.status.finished:
                continue
            self._restored(req, s.ext)
            if req.request_id in skip:
                continue
            self._publish(req)
            if s.samples:
                req.append_output(sampled[req.request_id])
                self.stats.generation_tokens += 1
                changed.append(req)
                if req.num_output_tokens >= req.max_tokens:
                    self._finish(req, RequestStatus.FINISHED_LENGTH)
        for rid in kvo.finished_recving or ():
            if rid in self.holds:
                self._drop_hold(rid, "recv")
            elif rid in self.requests:
                self.finished_recving.add(rid)
        for rid in kvo.finished_sending or ():
            self._drop_hold(rid, "send")
        return changed

    def _handle_invalid_blocks(self, so: SchedulerOutput, invalid: Set[int]) -> Set[str]:
        """Truncate computed tokens at the first failed block; those tokens are recomputed."""
        skip: Set[str] = set()
        for s in so.seqs:
            if not s.ext or s.request.status.finished:
                continue
            lo, hi = s.ext_start // self.B, cdiv(s.ext_start + s.ext, self.B)
            bad = [i for i in range(lo, hi) if s.block_ids[i] in invalid]
            if bad:
                s.request.num_computed_tokens = bad[0] * self.B
                s.ext = max(0, bad[0] * self.B - s.ext_start)
                s.request.num_external_computed_tokens = s.ext
                self.stats.load_error_blocks += len(bad)
                skip.add(s.request.request_id)
        for req in self.waiting:
            if req.status != RequestStatus.WAITING_FOR_REMOTE_KVS:
                continue
            blocks = self.req_blocks[req.request_id]
            bad = [i for i in range(req.local_hit_tokens // self.B, len(blocks)) if blocks[i] in invalid]
            if bad:
                prev = self.failed_block.get(req.request_id, bad[0])
                self.failed_block[req.request_id] = min(prev, bad[0])
                self.stats.load_error_blocks += len(bad)
        return skip

    def _finish(self, req: Request, status: RequestStatus) -> None:
        rid = req.request_id
        was_loading = req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and rid not in self.finished_recving
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        req.status = status
        self.finished_recving.discard(rid)
        self.failed_block.pop(rid, None)
        blocks = self._release(rid)
        delay = False
        if self.connector is not None:
            delay, req.kv_transfer_params_out = self.connector.request_finished(req, blocks)
        holds = ({"send"} if delay else set()) | ({"recv"} if was_loading else set())
        if holds:
            self.holds[rid] = (holds, blocks)
        else:
            self._free(blocks)
        del self.requests[rid]
        self.finished_since_step.add(rid)
        self.stats.requests_finished += 1

    def _drop_hold(self, rid: str, kind: str) -> None:
        entry = self.holds.get(rid)
        if entry is None:
            return
        entry[0].discard(kind)
        if not entry[0]:
            del self.holds[rid]
            self._free(entry[1])
