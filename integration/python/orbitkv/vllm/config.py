"""Connector configuration: ``kv_connector_extra_config`` plus what can be
derived from vLLM's config.

Extra-config keys (all optional except ``socket``):
  socket            peer Unix socket path
  page_tokens       tokens per OrbitKV page (default 64; a multiple of the block size)
  block_tokens      engine block size (default: vLLM cache_config.block_size)
  timeout_s         deadline of every control call (default 5)
  connect_timeout_s how long a connection attempt and a session open wait for a peer that
                    accepted the connection but is slow to answer (busy, paused) before it
                    counts as unreachable (default 5; an open waits the larger of this and
                    timeout_s). A peer that is down refuses at once: the engine starts
                    without the cache and the session opens in the background once it is up.
  lease_ms          lookup lease time (0 = the peer's default)
  load_deadline_ms, save_deadline_ms   per-operation deadlines (default 30000)
  async_load        load between steps (True) or inside the step (False). Default: inside
                    the step on vLLM >= 0.29, between steps on older vLLM and other engines.
                    vLLM >= 0.29 starts a step's async loads after its forward and reports them
                    done a step later: on an H100 with vLLM 0.33 an 8K-token restore reached
                    its first token 12-20 ms later async than sync (77.6 against 57.9-65.3 ms
                    p50), and the sync loads cost the seeds' sustained workload nothing
                    (11.57 req/s, vLLM's own offloading 10.97; 2026-12-06). Unset, a P/D
                    handoff that covers the whole prompt still loads between steps (only an
                    async hit may cover the prompt's last page: docs/pd.md); set, it applies
                    to handoffs too
  layerwise         layer-wise loads (default False): loads run inside the step
                    (async_load is then False) and, where the peer gives the
                    CUDA session layer events, layer l's attention waits on the
                    GPU only for layer l's copy (the restore overlaps the
                    forward). Without layer events: whole-request sync loads.
                    vLLM keeps its full CUDA graphs (for decode-only batches under its
                    default FULL_AND_PIECEWISE mode): a step it runs as one full graph (no
                    per-layer hooks inside) waits on the GPU for every layer's copy before
                    the graph starts, in vLLM's V1 and V2 model runners alike.
  layerwise_piecewise  with layerwise: ask vLLM for piecewise CUDA graphs only
                    (requires_piecewise_for_cudagraph, what vLLM's own layer-wise
                    connectors do; decode steps then lose their full graphs). Default False.
  gate              restore admission gate: true (default: queue-aware on vLLM >= 0.26
                    under FCFS, strict otherwise; orbitkv.gate), "strict" (one restore
                    at a time, nothing admitted beside it), false (off: experiments only)
  early_free        free a finished request's blocks at once even while its saves are in
                    flight (default False: vLLM frees them once the saves are reported,
                    request_finished's delayed free). A block handed out again before its
                    save ended is waited for before the step that writes it (orbitkv.vllm.fences:
                    a flush on reuse, bounded by save_deadline_ms). P/D handoffs keep the
                    delayed free. Experimental, for measurement: the flush runs in
                    handle_preemptions, before vLLM's runner zeroes or copies a new block
                    (vLLM >= 0.26 passes the step's metadata there; older ones flush at
                    bind_connector_metadata, after those writes). TP only (the fence
                    counts tp_size workers; not PP).
  durability        "dram" (default): a save is acknowledged once the page is in
                    the peer's DRAM pool (it reaches SSD only when demoted, and a
                    peer restart loses it until then); "ssd": acknowledged once
                    it is also durable on the peer's SSD tier (write-through), so
                    it survives a peer restart or kill -9. Needs the peer's SSD
                    tier (--ssd-bytes > 0); without it every save fails (no_space)
                    and requests simply recompute.
  lookup_refresh_s  how long a cached miss is trusted before asking again (default 0.5)
  recompute_tokens_per_s  the engine's prefill throughput for this model, used until
                    the scheduler half has measured it from the engine's own steps
                    (orbitkv.vllm.prefill_rate; default 0: unknown until measured).
                    Lookups carry the rate, and the peer leaves pages it holds only
                    on SSD to recompute while its measured SSD reads are slower
                    (a slow disk); DRAM hits are restored as always.
  kv_layout         "auto" | "flash" | "flashinfer" | "packed" (worker tensor shape;
                    orbitkv.buffers). The page byte layout defaults to what the
                    installed vLLM allocates (_compat.vllm_byte_layout); the worker
                    refuses tensors whose bytes do not match it.
  layout            dict overriding Layout fields: model, revision, dtype,
                    num_layers, kv_heads, head_dim, tp_size, byte_layout
  model, revision, dtype, byte_layout   the same, as top-level keys
  tp_rank           worker rank when vLLM's parallel state is unavailable
  kv_role           P/D role (orbitkv.vllm.pd), default vLLM's kv_transfer_config.kv_role:
                    "kv_producer" saves every prompt page and returns kv_transfer_params
                    naming its peer and page count; "kv_consumer" never saves and, for a
                    request whose kv_transfer_params say do_remote_prefill, waits up to
                    pd_wait_ms for the producer's pages; "kv_both" (default) does both.
  pd_wait_ms        how long a consumer waits for a handed-off request's pages to be
                    visible before it recomputes what is missing (default 2000)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

from orbitkv.keys import Layout
from orbitkv.vllm._compat import _at_least, engine_fences_loads, vllm_byte_layout, vllm_version

KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")

_TORCH_DTYPES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "half": "fp16", "float": "fp32"}


@dataclasses.dataclass(frozen=True)
class ConnectorConfig:
    socket: str
    layout: Layout  # tp_rank 0; workers substitute their rank
    block_tokens: int
    timeout_s: float = 5.0
    connect_timeout_s: float = 5.0
    lease_ms: int = 0
    load_deadline_ms: int = 30000
    save_deadline_ms: int = 30000
    async_load: bool = True
    handoff_async: bool = True  # a whole-prompt P/D handoff loads between steps (async_load unset, or true)
    layerwise: bool = False
    gate: bool = True
    gate_strict: bool = False
    early_free: bool = False
    durability: str = "dram"
    lookup_refresh_s: float = 0.5
    recompute_tokens_per_s: int = 0
    engine_fences_loads: bool = False  # vLLM holds freed blocks from restores until their steps end
    kv_layout: str = "auto"
    tp_rank: Optional[int] = None
    engine_id: str = "vllm"
    kv_role: str = "kv_both"
    pd_wait_ms: int = 2000

    @property
    def saves(self) -> bool:
        """Whether this engine saves its KV (a kv_consumer never does)."""
        return self.kv_role != "kv_consumer"

    @property
    def blocks_per_page(self) -> int:
        return self.layout.page_tokens // self.block_tokens

    def validate(self) -> None:
        if not self.socket:
            raise ValueError("orbitkv connector: kv_connector_extra_config.socket is required")
        if self.block_tokens <= 0 or self.layout.page_tokens % self.block_tokens:
            raise ValueError(
                f"orbitkv connector: page_tokens {self.layout.page_tokens} must be a multiple of the block size {self.block_tokens}"
            )
        if self.recompute_tokens_per_s < 0:
            raise ValueError(f"orbitkv connector: recompute_tokens_per_s must be >= 0, got {self.recompute_tokens_per_s}")
        if self.kv_role not in KV_ROLES:
            raise ValueError(f"orbitkv connector: kv_role must be one of {', '.join(KV_ROLES)}, got {self.kv_role!r}")
        if self.connect_timeout_s <= 0:
            raise ValueError(f"orbitkv connector: connect_timeout_s must be > 0, got {self.connect_timeout_s}")
        if self.pd_wait_ms < 0:
            raise ValueError(f"orbitkv connector: pd_wait_ms must be >= 0, got {self.pd_wait_ms}")
        if self.durability not in ("dram", "ssd"):
            raise ValueError(f"orbitkv connector: durability must be dram or ssd, got {self.durability!r}")


def _dtype_name(d: Any) -> str:
    s = str(d).replace("torch.", "")
    return _TORCH_DTYPES.get(s, s)


def _from_vllm(vllm_config: Any) -> dict[str, Any]:
    """Layout fields and block size vLLM's config implies (best effort)."""
    out: dict[str, Any] = {}
    mc = getattr(vllm_config, "model_config", None)
    pc = getattr(vllm_config, "parallel_config", None)
    cc = getattr(vllm_config, "cache_config", None)
    if mc is None:
        return out
    out["model"] = str(getattr(mc, "model", ""))
    out["revision"] = str(getattr(mc, "revision", None) or "")
    cache_dtype = getattr(cc, "cache_dtype", "auto") if cc is not None else "auto"
    if cache_dtype in (None, "auto"):
        out["dtype"] = _dtype_name(mc.dtype)
    elif cache_dtype in ("fp8", "fp8_e4m3"):
        out["dtype"] = "fp8_e4m3"
    else:
        out["dtype"] = str(cache_dtype)
    try:
        out["num_layers"] = mc.get_num_layers(pc)
        out["kv_heads"] = mc.get_num_kv_heads(pc)
        out["head_dim"] = mc.get_head_size()
    except Exception:
        pass
    if pc is not None:
        out["tp_size"] = int(getattr(pc, "tensor_parallel_size", 1))
    if cc is not None and getattr(cc, "block_size", None):
        out["block_tokens"] = int(cc.block_size)
    byte_layout = vllm_byte_layout(int(out.get("block_tokens", 16)))
    if byte_layout:
        out["byte_layout"] = byte_layout
    return out


def extra_config_of(vllm_config: Any) -> dict[str, Any]:
    if isinstance(vllm_config, Mapping):
        return dict(vllm_config)
    kvt = getattr(vllm_config, "kv_transfer_config", None)
    extra = getattr(kvt, "kv_connector_extra_config", None) if kvt is not None else None
    return dict(extra or {})


def kv_role_of(vllm_config: Any, extra: Mapping[str, Any]) -> str:
    """The P/D role: extra config's kv_role, else vLLM's kv_transfer_config.kv_role."""
    if extra.get("kv_role"):
        return str(extra["kv_role"])
    kvt = None if isinstance(vllm_config, Mapping) else getattr(vllm_config, "kv_transfer_config", None)
    return str(getattr(kvt, "kv_role", None) or "kv_both")


def load_config(vllm_config: Any) -> ConnectorConfig:
    """Builds the config from a VllmConfig (or any object with
    ``kv_transfer_config.kv_connector_extra_config``, or the extra-config
    dict itself)."""
    extra = extra_config_of(vllm_config)
    derived = {} if isinstance(vllm_config, Mapping) else _from_vllm(vllm_config)
    lay = dict(model="", revision="", dtype="bf16", num_layers=0, kv_heads=0, head_dim=0, tp_size=1, byte_layout="vllm-flash")
    lay.update({k: v for k, v in derived.items() if k in lay})
    lay.update({k: extra[k] for k in ("model", "revision", "dtype", "byte_layout") if k in extra})
    lay.update(extra.get("layout", {}))
    page_tokens = int(extra.get("page_tokens", lay.pop("page_tokens", 64)))
    layout = Layout(tp_rank=0, page_tokens=page_tokens, **{k: lay[k] for k in lay if k != "tp_rank"})
    cfg = ConnectorConfig(
        socket=str(extra.get("socket", "")),
        layout=layout,
        block_tokens=int(extra.get("block_tokens", derived.get("block_tokens", 16))),
        timeout_s=float(extra.get("timeout_s", 5.0)),
        connect_timeout_s=float(extra.get("connect_timeout_s", 5.0)),
        lease_ms=int(extra.get("lease_ms", 0)),
        load_deadline_ms=int(extra.get("load_deadline_ms", 30000)),
        save_deadline_ms=int(extra.get("save_deadline_ms", 30000)),
        async_load=_flag(extra.get("async_load", default_async_load(None if isinstance(vllm_config, Mapping) else vllm_config)),
                         "async_load") and not bool(extra.get("layerwise", False)),
        handoff_async=_flag(extra.get("async_load", True), "async_load") and not bool(extra.get("layerwise", False)),
        layerwise=bool(extra.get("layerwise", False)),
        gate=_gate(extra.get("gate", True))[0],
        gate_strict=_gate(extra.get("gate", True))[1],
        early_free=_flag(extra.get("early_free", False), "early_free"),
        durability=str(extra.get("durability", "dram")),
        lookup_refresh_s=float(extra.get("lookup_refresh_s", 0.5)),
        recompute_tokens_per_s=int(extra.get("recompute_tokens_per_s", 0)),
        engine_fences_loads=engine_fences_loads(None if isinstance(vllm_config, Mapping) else vllm_config),
        kv_layout=str(extra.get("kv_layout", "auto")),
        tp_rank=int(extra["tp_rank"]) if "tp_rank" in extra else None,
        engine_id=str(extra.get("engine_id", "vllm")),
        kv_role=kv_role_of(vllm_config, extra),
        pd_wait_ms=int(extra.get("pd_wait_ms", 2000)),
    )
    cfg.validate()
    return cfg


def default_async_load(vllm_config: Any, version: Optional[str] = None) -> bool:
    """Whether loads run between steps when the extra config does not say:
    not on vLLM >= 0.29 (see async_load above), yes without vLLM (the
    reference engine runs a load's step itself) and on older vLLM."""
    if vllm_config is None:
        return True
    version = vllm_version() if version is None else version
    return not (version and _at_least(version, (0, 29)))


def _flag(v: Any, name: str) -> bool:
    """A boolean extra-config value (JSON true/false or the strings)."""
    if isinstance(v, str):
        if v.lower() in ("true", "false"):
            return v.lower() == "true"
        raise ValueError(f'orbitkv: kv_connector_extra_config "{name}" must be true or false, not {v!r}')
    return bool(v)


def _gate(v: Any) -> tuple[bool, bool]:
    """extra config "gate": true, false or "strict" -> (enabled, strict)."""
    if isinstance(v, str):
        if v.lower() == "strict":
            return True, True
        if v.lower() in ("true", "false"):
            return v.lower() == "true", False
        raise ValueError(f'orbitkv: kv_connector_extra_config "gate" must be true, false or "strict", not {v!r}')
    return bool(v), False
