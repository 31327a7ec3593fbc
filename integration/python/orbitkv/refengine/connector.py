"""The KV connector seam: the objects vLLM's V1 connector API passes, and connector loading.

The engine drives a connector exactly as vLLM's scheduler and model runner do
(research/engine-apis.md §1.3): two instances of the connector class, one constructed with
role SCHEDULER and one with role WORKER, talking only through the metadata object that
build_connector_meta returns. The classes here are duck-typed stand-ins for the vLLM types a
connector touches; they carry the same attribute names.
"""

from __future__ import annotations

import dataclasses
import enum
import importlib
import inspect
import types
from typing import Any, Dict, List, Optional, Set, Tuple

from .config import EngineConfig
from .kvpool import KVPool, layer_name


class KVConnectorRole(enum.IntEnum):
    SCHEDULER = 0
    WORKER = 1


@dataclasses.dataclass
class KVCacheBlock:
    block_id: int
    block_hash: Optional[bytes] = None


class KVCacheBlocks:
    """vLLM's KVCacheBlocks for one KV-cache group."""

    def __init__(self, blocks: List[KVCacheBlock]):
        self.blocks = (blocks,)

    def get_block_ids(self) -> Tuple[List[int], ...]:
        return ([b.block_id for b in self.blocks[0]],)

    def get_unhashed_block_ids(self) -> List[int]:
        return [b.block_id for b in self.blocks[0] if b.block_hash is None]


@dataclasses.dataclass
class KVConnectorOutput:
    """What the worker half reports after a step (aggregated over one worker)."""

    finished_sending: Optional[Set[str]] = None
    finished_recving: Optional[Set[str]] = None
    failed_recving: Optional[Set[str]] = None
    invalid_block_ids: Set[int] = dataclasses.field(default_factory=set)
    kv_connector_stats: Any = None
    kv_connector_worker_meta: Any = None

    def is_empty(self) -> bool:
        return not (self.finished_sending or self.finished_recving or self.invalid_block_ids
                    or self.kv_connector_worker_meta)


def vllm_config_for(cfg: EngineConfig, pool: KVPool, extra: Dict[str, Any]) -> types.SimpleNamespace:
    """A stand-in for VllmConfig with the fields KV connectors read."""
    m = cfg.model
    ns = types.SimpleNamespace
    hf = ns(num_hidden_layers=m.num_layers, num_attention_heads=m.num_q_heads,
            num_key_value_heads=m.num_kv_heads, head_dim=m.head_dim, hidden_size=m.hidden,
            vocab_size=m.vocab, model_type="qwen3")
    model_config = ns(
        model=m.name, served_model_name=m.name, revision="refengine-seed-%d" % cfg.seed, dtype=m.torch_dtype,
        hf_config=hf, hf_text_config=hf, max_model_len=cfg.kv_tokens,
        get_num_layers=lambda parallel_config=None: m.num_layers,
        get_num_kv_heads=lambda parallel_config=None: m.num_kv_heads,
        get_head_size=lambda: m.head_dim,
        get_total_num_kv_heads=lambda: m.num_kv_heads)
    extra = dict(extra)
    extra.setdefault("page_tokens", cfg.page_tokens)
    extra.setdefault("shm_path", pool.shm_path)
    extra.setdefault("byte_layout", "vllm-flash")
    extra.setdefault("engine_id", cfg.engine_id)
    role = str(extra.get("kv_role", "kv_both"))  # P/D role (orbitkv.vllm.pd), vLLM's kv_role
    kv_transfer = ns(kv_connector="OrbitKVConnector", kv_connector_module_path="orbitkv.vllm",
                     kv_role=role, kv_connector_extra_config=extra, engine_id=cfg.engine_id,
                     kv_load_failure_policy="recompute", is_kv_producer=role != "kv_consumer",
                     is_kv_consumer=role != "kv_producer")
    kv_transfer.get_from_extra_config = lambda key, default=None: extra.get(key, default)
    return ns(
        model_config=model_config,
        cache_config=ns(block_size=cfg.block_size, cache_dtype="auto", num_gpu_blocks=pool.num_blocks,
                        enable_prefix_caching=cfg.enable_prefix_caching),
        parallel_config=ns(tensor_parallel_size=1, pipeline_parallel_size=1, rank=0, world_size=1,
                           data_parallel_rank=0),
        scheduler_config=ns(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_batched_tokens),
        device_config=ns(device=pool.device, device_type=pool.device.type),
        kv_transfer_config=kv_transfer,
        refengine=ns(pool=pool.describe(), config=cfg))


def kv_cache_config_for(cfg: EngineConfig, pool: KVPool) -> types.SimpleNamespace:
    """A stand-in for vLLM's KVCacheConfig: one group with every layer."""
    ns = types.SimpleNamespace
    names = [layer_name(i) for i in range(pool.num_layers)]
    spec = ns(block_size=cfg.block_size, num_kv_heads=pool.kv_heads, head_size=pool.head_dim,
              dtype=pool.dtype, page_size_bytes=2 * pool.block_bytes)
    return ns(num_blocks=pool.num_blocks,
              kv_cache_tensors=[ns(size=2 * pool.num_blocks * pool.block_bytes, shared_by=[n]) for n in names],
              kv_cache_groups=[ns(layer_names=names, kv_cache_spec=spec)])


def construct(cls, vllm_config, role, kv_cache_config):
    """Construct a connector half the way vLLM's factory does (3-arg, else legacy 2-arg)."""
    params = inspect.signature(cls).parameters
    if "kv_cache_config" in params or len(params) >= 3:
        return cls(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
    return cls(vllm_config, role)


def load_connector(kind: str, cfg: EngineConfig, pool: KVPool,
                   extra: Optional[Dict[str, Any]] = None) -> Tuple[Any, Any]:
    """(scheduler half, worker half) for --connector KIND; (None, None) for "none"."""
    if kind in ("none", "", None):
        return None, None
    if kind != "orbitkv":
        raise ValueError(f"unknown connector {kind!r} (none, orbitkv)")
    cls = getattr(importlib.import_module("orbitkv.vllm"), "OrbitKVConnector")
    try:  # the role type the connector's base class uses (vLLM's when vLLM is installed)
        role_enum = importlib.import_module("orbitkv.vllm._compat").KVConnectorRole
    except (ImportError, AttributeError):
        role_enum = KVConnectorRole
    vc = vllm_config_for(cfg, pool, extra or {})
    kcc = kv_cache_config_for(cfg, pool)
    sched = construct(cls, vc, role_enum.SCHEDULER, kcc)
    worker = construct(cls, vc, role_enum.WORKER, kcc)
    return sched, worker
