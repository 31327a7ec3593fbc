"""Drives vLLM 0.33's own tiering manager (TieringOffloadingSpec.get_manager:
its CPU primary tier on a /dev/shm pool, its SecondaryTierFactory loading
OrbitKVTier by module path) the way its OffloadingConnector scheduler does,
without a GPU: vLLM's offloading worker (GPU <-> CPU copies) refuses to start
on a CPU platform ("only supported on CUDA-alike and XPU GPUs"), so the GPU
side of a store is played by writing the CPU rows vLLM hands out, and the
GPU side of a load by reading the rows it pins."""

from __future__ import annotations

import itertools
import os
import time
import uuid
from typing import Optional, Sequence

import numpy as np
from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext, make_offload_key
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

ROW_BYTES = 8192  # worker KV bytes per block (one block per chunk): the CPU row
# Short deadlines: a test that stops the peer waits for them to pass.
FAST = dict(rpc_timeout_s=0.5, connect_timeout_s=0.5, store_deadline_ms=1500, load_deadline_ms=1500,
            abandon_grace_s=0.5)
BOUND_S = 60.0  # a hang guard only: every wait ends by the tier's own deadlines, far sooner
ABANDON_S = FAST["store_deadline_ms"] / 1000 + FAST["abandon_grace_s"]
END = ScheduleEndContext((), ())
_req_ids = itertools.count()


def offload_config(tier: dict, *, model: str = "orbitkv/tiny", dtype: str = "bfloat16", chunks: int = 64,
                   engine_id: Optional[str] = None, row: int = ROW_BYTES) -> OffloadingConfig:
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(tokens_per_block=16, layer_names=("model.layers.0", "model.layers.1"),
                                      group_id=0),),
        worker_kv_bytes_per_block=row,
        enable_kv_cache_events=False,
        extra_config={"cpu_bytes_to_use": chunks * row, "secondary_tiers": [dict(tier)]},
        engine_id=engine_id or f"okvt-{uuid.uuid4().hex[:12]}",
        model=OffloadingModelConfig(name=model, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(rank=0, world_size=1, tp_size=1, pp_size=1, pcp_size=1, dcp_size=1,
                                          data_parallel_index=0, data_parallel_size=1, data_parallel_rank_local=None,
                                          is_parallelism_agnostic=True),
    )


def tier_entry(socket: str, **options) -> dict:
    """The tier's entry; $ORBITKV_VTIER_WORKER sets its worker unless the test
    does (make test-vllm033 runs test_vllm_tier.py with each kind)."""
    worker = os.environ.get("ORBITKV_VTIER_WORKER")
    if worker:
        options.setdefault("worker", worker)
    return {"type": "OrbitKVTier", "module_path": "orbitkv.vllm_tier", "socket": socket, **options}


def keys_for(prefix: int, n: int) -> list[bytes]:
    """n chained-looking vLLM offload keys (32-byte block hashes, group 0)."""
    return [make_offload_key(bytes([prefix % 256, i % 256, i // 256]) * 10 + b"\x00\x01", 0) for i in range(n)]


def row_bytes(key: bytes) -> np.ndarray:
    """The row a key's block holds in these tests (a function of the key)."""
    seed = int.from_bytes(key[:8], "little") ^ int.from_bytes(key[8:16], "little")
    return np.random.default_rng(seed).integers(0, 256, ROW_BYTES, dtype=np.uint8)


class Engine:
    """One vLLM engine's scheduler-side offloading manager with OrbitKVTier."""

    def __init__(self, tier: dict, **config) -> None:
        self.spec = TieringOffloadingSpec(offload_config(tier, **config))
        self.manager = self.spec.get_manager()
        self.tier = self.manager.secondary_tiers[0]
        self.pool = np.asarray(self.manager.primary_tier.get_kv_memoryview()).view(np.uint8)

    def step(self) -> None:
        with self.manager.lock:
            self.manager.on_schedule_end(END)

    def idle(self) -> bool:
        with self.manager.lock:
            return not self.manager.has_pending_work()

    def settle(self, timeout: float) -> float:
        """Steps until nothing is pending; returns the seconds it took."""
        t0 = time.monotonic()
        while True:
            self.step()
            if self.idle():
                return time.monotonic() - t0
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"tier still busy after {timeout}s")
            time.sleep(0.002)

    def store(self, keys: Sequence[bytes]) -> list[bytes]:
        """A request computes these blocks and offloads them (to the CPU pool,
        which cascades to the tier). Returns the keys vLLM stored."""
        m, ctx = self.manager, ReqContext(f"store-{next(_req_ids)}")
        with m.lock:
            m.on_new_request(ctx)
            out = m.prepare_store(list(keys), ctx)
            stored = list(out.keys_to_store) if out is not None else []
            if out is not None:
                for k, c in zip(out.keys_to_store, out.store_spec.chunk_ids):
                    self.pool[c] = row_bytes(k)
                m.complete_store(out.keys_to_store, ctx, True)
            m.on_request_finished(ctx)
        return stored

    def lookup(self, keys: Sequence[bytes], timeout: float) -> tuple[list, ReqContext]:
        """Looks the keys up as vLLM's scheduler does, a step at a time, until
        no answer is RETRY or HIT_PENDING; returns the answers and the request."""
        m, ctx = self.manager, ReqContext(f"load-{next(_req_ids)}")
        with m.lock:
            m.on_new_request(ctx)
        t0 = time.monotonic()
        while True:
            with m.lock:
                answers = [m.lookup(k, ctx) for k in keys]
                m.on_schedule_end(END)
            if all(a in (LookupResult.HIT, LookupResult.MISS) for a in answers):
                return answers, ctx
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"lookups still pending after {timeout}s: {answers}")
            time.sleep(0.002)

    def read(self, keys: Sequence[bytes], ctx: ReqContext) -> list[np.ndarray]:
        """The rows of HIT keys, as vLLM's GPU worker would load them."""
        m = self.manager
        with m.lock:
            spec = m.prepare_load(list(keys), ctx)
            rows = [self.pool[c].copy() for c in spec.chunk_ids]
            m.complete_load(list(keys), ctx)
        return rows

    def finish(self, ctx: ReqContext) -> None:
        with self.manager.lock:
            self.manager.on_request_finished(ctx)

    def close(self) -> None:
        self.pool = None
        self.manager.shutdown()
