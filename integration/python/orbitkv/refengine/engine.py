"""The engine: KV pool + model + scheduler + model runner, stepped synchronously.

`Engine.step()` is one scheduler step (schedule → forward → update). It is not thread safe;
`loop.EngineLoop` owns an Engine on one thread and serves many callers.
"""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .config import EngineConfig
from .kvpool import KVPool
from .model import Qwen3Model
from .request import Request, RequestStatus
from .scheduler import Scheduler
from .worker import ModelRunner

ConnectorSpec = Union[None, Tuple[Any, Any], Callable[[EngineConfig, KVPool], Tuple[Any, Any]]]

_ids = itertools.count()


class Engine:
    """connector: None, a (scheduler half, worker half) pair, or a factory(cfg, pool) → pair."""

    def __init__(self, cfg: EngineConfig, connector: ConnectorSpec = None):
        cfg.validate()
        self.cfg = cfg
        self._closed = False
        self.last_step_tokens = 0
        self._steps: Dict[str, float] = dict.fromkeys(
            ("prefill_steps", "prefill_step_seconds", "decode_steps", "decode_step_seconds",
             "idle_step_seconds", "computed_prompt_tokens"), 0)
        self.pool = KVPool(cfg)
        try:
            self.model = Qwen3Model(cfg.model, cfg.device, cfg.seed)
            halves = connector(cfg, self.pool) if callable(connector) else connector
            self.connector_scheduler, self.connector_worker = halves or (None, None)
            self.scheduler = Scheduler(cfg, self.connector_scheduler)
            self.runner = ModelRunner(cfg, self.model, self.pool, self.connector_worker)
        except BaseException:
            self.pool.close()
            raise

    # -- requests -------------------------------------------------------------------------
    def add_request(self, prompt_token_ids: Sequence[int], max_tokens: int,
                    request_id: Optional[str] = None,
                    kv_transfer_params: Optional[Dict[str, Any]] = None) -> Request:
        vocab = self.cfg.model.vocab
        bad = [t for t in prompt_token_ids if not (isinstance(t, int) and 0 <= t < vocab)]
        if bad:
            raise ValueError(f"token ids must be ints in [0, {vocab}); got {bad[:3]}")
        rid = request_id or f"req-{next(_ids)}"
        req = Request(rid, list(prompt_token_ids), max_tokens, self.cfg.block_size, kv_transfer_params)
        self.scheduler.add_request(req)
        return req

    def abort(self, request_id: str) -> Optional[Request]:
        return self.scheduler.abort(request_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def reset_prefix_cache(self) -> int:
        """Drop every cached block not held by a request (vLLM's reset_prefix_cache); returns
        how many were dropped. Probes call it for a fresh engine state between samples."""
        return self.scheduler.pool.reset()

    def step(self) -> List[Request]:
        """One scheduler step; returns requests that got a token or finished."""
        t0 = time.perf_counter()
        so = self.scheduler.schedule()
        self.last_step_tokens = so.total_num_scheduled_tokens
        sampled, kvo = self.runner.execute(so)
        out = self.scheduler.update_from_output(so, sampled, kvo)
        self._account(so, time.perf_counter() - t0)
        return out

    def _account(self, so: Any, seconds: float) -> None:
        """Where the engine's time goes: steps that compute prompt tokens (prefill, with
        whatever decodes ride along) vs decode-only steps, and the prompt tokens computed
        (not served by the local prefix cache or the connector)."""
        prompt = sum(max(0, min(s.start + s.num_tokens, s.request.num_prompt_tokens) - s.start) for s in so.seqs)
        st = self._steps
        if prompt:
            st["prefill_steps"] += 1
            st["prefill_step_seconds"] += seconds
        elif so.total_num_scheduled_tokens:
            st["decode_steps"] += 1
            st["decode_step_seconds"] += seconds
        else:
            st["idle_step_seconds"] += seconds
        st["computed_prompt_tokens"] += prompt

    def generate(self, prompts: Sequence[Sequence[int]], max_tokens: int,
                 max_steps: int = 100_000, idle_s: float = 0.001) -> List[List[int]]:
        """Submit all prompts at once and step until they are done and every transfer has
        drained (tests and benchmarks), at most max_steps steps: bounded by steps, never by
        elapsed time (a busy machine only makes it slower). A step that schedules nothing
        waits for one of the connector's transfers in flight to end (each is bounded by the
        connector's own deadlines), or idle_s when it cannot tell."""
        reqs = [self.add_request(p, max_tokens) for p in prompts]
        for _ in range(max_steps):
            if not self.has_work():
                return [r.output_token_ids for r in reqs]
            self.step()
            if self.last_step_tokens == 0:
                self.wait_idle(idle_s)
        raise RuntimeError(f"generate: not done after {max_steps} steps: {reqs}")

    def wait_idle(self, idle_s: float = 0.001) -> None:
        """After a step that computed nothing: wait until a load or save of the OrbitKV
        connector's worker half ends (at once if one already has), else idle_s."""
        w = getattr(self.connector_worker, "_worker", None)
        lock = getattr(w, "_lock", None)
        if lock is None:
            time.sleep(idle_s)
            return
        with lock:
            futs = [st.future for st in w._loads.values()] + [f for fs in w._saves.values() for f in fs]
        if not futs:
            time.sleep(idle_s)
        elif not any(f.done() for f in futs):
            cf.wait(futs, return_when=cf.FIRST_COMPLETED)

    # -- introspection --------------------------------------------------------------------
    def stats(self) -> Dict[str, float]:
        s = self.scheduler
        out = dict(vars(s.stats))
        out.update(self._steps)
        out.update(
            requests_running=len(s.running),
            requests_waiting=sum(1 for r in s.waiting if r.status != RequestStatus.WAITING_FOR_REMOTE_KVS),
            requests_waiting_for_remote_kvs=sum(1 for r in s.waiting
                                                if r.status == RequestStatus.WAITING_FOR_REMOTE_KVS),
            requests_held=len(s.holds),
            kv_blocks_total=s.pool.num_blocks, kv_blocks_free=s.pool.num_free(),
            kv_blocks_cached=len(s.pool.cached), kv_usage=s.pool.usage(),
            prefix_cache_evictions=s.pool.evictions)
        return out

    def close(self) -> None:
        """Idempotent: shut the connector halves down, then release the KV pool."""
        if self._closed:
            return
        self._closed = True
        for half in (getattr(self, "connector_worker", None), getattr(self, "connector_scheduler", None)):
            if half is not None and hasattr(half, "shutdown"):
                half.shutdown()
        self.pool.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
