"""OrbitKVConnector: vLLM's V1 KV connector API, split into the scheduler
half (orbitkv.vllm.scheduler) and the worker half (orbitkv.vllm.worker).

Load it with::

  --kv-transfer-config '{"kv_connector":"OrbitKVConnector",
    "kv_connector_module_path":"orbitkv.vllm","kv_role":"kv_both",
    "kv_connector_extra_config":{"socket":"/path/orbitkv.sock"}}'

Hybrid (multi-group) KV caches are not supported: run vLLM with
``--disable-hybrid-kv-cache-manager``. Without vLLM installed, the same
class runs on minimal stand-in base types (the reference engine uses it so).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable, Mapping, Optional, Sequence

from orbitkv.client import Client, ControlSession
from orbitkv.vllm._compat import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorTransferResults,
    _at_least,
    block_ids_of,
    is_scheduler,
    kv_cache_layout,
    vllm_version,
)
from orbitkv.vllm.config import ConnectorConfig, load_config
from orbitkv.vllm.metadata import OrbitKVMetadata
from orbitkv.vllm import pd
from orbitkv.hooktrace import HookTrace
from orbitkv.vllm.scheduler import LookupBackend, SchedulerHalf
from orbitkv.vllm.stats import OrbitKVStats, from_data
from orbitkv.vllm.worker import WorkerHalf

log = logging.getLogger(__name__)

try:  # vLLM >= 0.33: cached prompt tokens counted by source
    from vllm.v1.metrics.cache_hit_source import CacheHitSource as _CacheHitSource  # type: ignore
except Exception:  # older vLLM, or none
    _CacheHitSource = None


def _tp_rank(cfg: ConnectorConfig) -> int:
    if cfg.tp_rank is not None:
        return cfg.tp_rank
    try:  # pragma: no cover - needs vLLM's distributed state
        from vllm.distributed.parallel_state import get_tensor_model_parallel_rank  # type: ignore

        return int(get_tensor_model_parallel_rank())
    except Exception:
        return 0


def gate_mode(vllm_config: Any, kv_cache_config: Any, version: Optional[str] = None) -> dict:
    """The restore gate's queue-aware mode (orbitkv.gate) for a vLLM that
    visits skipped requests before new ones: 0.26 and later under FCFS
    (``Scheduler._select_waiting_queue_for_scheduling``; priority scheduling
    compares queue heads, so a new request can come first). Strict otherwise,
    and where the cache's size is not known."""
    version = vllm_version() if version is None else version
    policy = str(getattr(getattr(vllm_config, "scheduler_config", None), "policy", "") or "")
    blocks = int(getattr(kv_cache_config, "num_blocks", 0) or 0)
    if not version or not _at_least(version, (0, 26)) or not policy.lower().endswith("fcfs") or blocks <= 1:
        return {}
    return {"skipped_first": True, "capacity_blocks": blocks - 1}  # block 0 is vLLM's null block


def _warn_failure_policy(vllm_config: Any) -> None:
    """vLLM fails a request whose external KV does not load unless
    kv_load_failure_policy is "recompute"; with OrbitKV a failed load (a
    page evicted or corrupt, the peer restarted) should cost recompute only."""
    kvt = getattr(vllm_config, "kv_transfer_config", None)
    if getattr(kvt, "kv_load_failure_policy", "recompute") != "recompute":
        log.warning("orbitkv: kv_transfer_config.kv_load_failure_policy is %r: a page that fails to load "
                    "fails its request; set \"kv_load_failure_policy\":\"recompute\" to recompute it instead",
                    kvt.kv_load_failure_policy)


def _hooks_skipped(forward_context: Any) -> bool:
    """Whether the step's attention layers will call no wait_for_layer_load,
    so that a layer-wise load must be waited for whole before the forward.
    vLLM's V1 runner says so in the context it passes (cudagraph_runtime_mode
    FULL: one full graph is replayed); its V2 runner (0.26's default for
    dense models) calls start_load_kv before a full graph outside the
    forward's own context, in one with no attention metadata — which is also
    when vLLM's hook wrapper (maybe_transfer_kv_layer) skips the hooks; and a
    step without a forward passes no metadata either."""
    if getattr(forward_context, "attn_metadata", None) is None:
        return True
    mode = getattr(forward_context, "cudagraph_runtime_mode", None)
    return getattr(mode, "name", None) == "FULL"


class OrbitKVConnector(KVConnectorBase_V1):
    """vLLM V1 KV connector backed by the host's OrbitKV peer."""

    def __init__(
        self,
        vllm_config: Any,
        role: Any,
        kv_cache_config: Any = None,
        *,
        lookup_backend: Optional[LookupBackend] = None,
    ) -> None:
        self._init_base(vllm_config, role, kv_cache_config)
        self.cfg = load_config(vllm_config)
        _warn_failure_policy(vllm_config)
        self._sched: Optional[SchedulerHalf] = None
        self._worker: Optional[WorkerHalf] = None
        self._control: Optional[ControlSession] = None
        self._client: Optional[Client] = None
        self._trace = HookTrace("scheduler" if is_scheduler(role) else "worker")  # off unless ORBITKV_HOOK_TRACE
        if is_scheduler(role):
            if lookup_backend is None:
                # Lazy: the engine starts even while the peer is down; lookups
                # report misses until the session opens (orbitkv.client).
                self._client = Client(self.cfg.socket, timeout=self.cfg.timeout_s,
                                      connect_timeout=self.cfg.connect_timeout_s, lazy=True)
                self._control = ControlSession(self._client, self.cfg.layout, self.cfg.block_tokens,
                                               f"{self.cfg.engine_id}-scheduler", lazy=True,
                                               recompute_tokens_per_s=self.cfg.recompute_tokens_per_s)
                lookup_backend = self._control
            mode = {} if self.cfg.gate_strict else gate_mode(vllm_config, kv_cache_config)
            self._sched = SchedulerHalf(self.cfg, lookup_backend, **mode)
            self._init_pd()
        else:
            self._worker = WorkerHalf(self.cfg, _tp_rank(self.cfg))

    def _init_pd(self) -> None:
        """P/D roles (orbitkv.vllm.pd): consumers wait for handed-off pages,
        producers report them."""
        self._member: Optional[dict] = None  # the peer's own cluster entry, asked for once
        self.handoffs: Optional[pd.Handoffs] = None
        if self.cfg.kv_role != "kv_producer":
            self.handoffs = pd.Handoffs(self.cfg.pd_wait_ms, self.cfg.layout.page_tokens, self.scheduler.peek_hit,
                                        whole=self.cfg.handoff_async)

    def _own_member(self) -> Optional[dict]:
        if self._member is None and self._control is not None and self._control.available:
            self._member = pd.own_member(self.cfg.socket, min(0.5, self.cfg.timeout_s))
        return self._member

    def _init_base(self, vllm_config: Any, role: Any, kv_cache_config: Any) -> None:
        if isinstance(vllm_config, Mapping):
            # Engines without vLLM pass the extra-config dict itself; vLLM's
            # base constructor wants a VllmConfig, so set what it would.
            self._connector_metadata = None
            self._vllm_config, self._role, self._kv_cache_config = vllm_config, role, kv_cache_config
            self._kv_transfer_config = None
            return
        try:
            super().__init__(vllm_config, role, kv_cache_config)
        except TypeError:  # older vLLM: two-argument base constructor
            super().__init__(vllm_config, role)  # type: ignore[call-arg]

    @classmethod
    def supports_sleep_mode(cls, kv_transfer_config: Any = None) -> bool:
        """No: sleep mode frees and remaps the KV cache, and the peer holds the
        registration (a shared-memory mapping or CUDA IPC handles) of the old
        one; restores after a wake-up would write into memory vLLM no longer
        uses. vLLM 0.33's base class answers True unless a connector says
        otherwise, and vLLM then refuses --enable-sleep-mode with this connector."""
        return False

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> Optional[str]:
        # Token-major blocks ("vllm-flash", "vllm-packed-nhd-b<B>" pages) on GPUs;
        # vLLM's CPU attention only runs head-major ("vllm-packed-hnd-b<B>").
        return kv_cache_layout()

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: Any) -> bool:
        """No, unless asked (layerwise_piecewise). Layer-wise loads wait inside
        attention (wait_for_layer_load), which a full CUDA graph does not run;
        vLLM replays full graphs for decode-only batches (and, in some modes,
        for mixed ones), and start_load_kv then waits for every layer's copy
        before the graph starts (_hooks_skipped): the restore loses its
        overlap in those steps only. Piecewise-only graphs cost every decode
        step (10.65 ms against 5.70 ms ITL on the H200)."""
        extra = extra_config or {}
        return bool(extra.get("layerwise", False)) and bool(extra.get("layerwise_piecewise", False))

    # --- scheduler side ----------------------------------------------------------

    @property
    def scheduler(self) -> SchedulerHalf:
        assert self._sched is not None, "scheduler-side method called on a worker connector"
        return self._sched

    @property
    def worker(self) -> WorkerHalf:
        assert self._worker is not None, "worker-side method called on a scheduler connector"
        return self._worker

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[Optional[int], bool]:
        with self._trace.hook("get_num_new_matched_tokens"):
            if self.handoffs is not None and self.handoffs.should_wait(request):
                out: tuple[Optional[int], bool] = (None, False)  # a handed-off request's pages are not all visible yet
            else:
                out = self.scheduler.get_num_new_matched_tokens(request, num_computed_tokens)
        if self._trace.enabled:
            self._trace.note("lookups", {"req": str(request.request_id), "computed": num_computed_tokens,
                                         "tokens": out[0] or 0, "async": out[1]})
        return out

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        with self._trace.hook("update_state_after_alloc"):
            self.scheduler.update_state_after_alloc(request, blocks, num_external_tokens)

    def get_external_cache_hit_sources(self, request: Any, num_external_tokens: int) -> dict:
        """vLLM >= 0.33: the external hit by tier, for
        vllm:prompt_tokens_cached_by_source_total: the peer's DRAM is "host",
        its SSD "disk", another peer's memory "p2p" (SchedulerHalf.hit_sources).
        Older vLLM never calls it."""
        by = self.scheduler.hit_sources(request, num_external_tokens)
        if _CacheHitSource is None:
            return by
        return {_CacheHitSource(k): v for k, v in by.items() if v}

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        with self._trace.hook("build_connector_meta"):
            meta = self._build_meta(scheduler_output)
        if self._trace.enabled:
            for spec in meta.loads:
                self._trace.note("loads", {"req": spec.req_id, "sync": spec.sync})
            for spec in meta.saves:
                self._trace.note("saves", spec.req_id)
            for req, n in (getattr(scheduler_output, "num_scheduled_tokens", None) or {}).items():
                self._trace.note("scheduled", {"req": str(req), "tokens": int(n)})
        self._trace.end_step()
        return meta

    def _build_meta(self, scheduler_output: Any) -> OrbitKVMetadata:
        meta = self.scheduler.build_connector_meta(scheduler_output)
        if meta.has_sync_loads and getattr(scheduler_output, "has_sync_kv_loads", True) is False:
            # vLLM >= 0.29 starts a step's loads after its forward unless this says a
            # scheduled request reads KV loaded in the step (vLLM sets it for the
            # requests it scheduled with a sync hit; set it for every sync load we plan,
            # so that none can run after the forward that reads its blocks).
            try:
                scheduler_output.has_sync_kv_loads = True
            except AttributeError:  # a derived property (the reference engine's): it reads the loads itself
                pass
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        with self._trace.hook("update_connector_output"):
            self.scheduler.update_connector_output(connector_output)

    def request_finished(self, request: Any, block_ids: Any = None) -> tuple[bool, Optional[dict]]:
        with self._trace.hook("request_finished"):
            return self._request_finished(request, block_ids)

    def _request_finished(self, request: Any, block_ids: Any) -> tuple[bool, Optional[dict]]:
        if self.handoffs is not None:
            self.handoffs.forget(request.request_id)
        pages = self.scheduler.planned_pages(request)
        tail = self.scheduler.planned_tail(request)
        handoff = pd.wants_handoff(self.cfg.kv_role, request)
        delay, params = self.scheduler.request_finished(request, block_ids, keep=handoff)
        if handoff:
            params = pd.handoff_params(self.cfg.engine_id, pages, self.cfg.layout.page_tokens, self._own_member(),
                                       block_ids_of(block_ids) if block_ids is not None else None, tail_tokens=tail)
        return delay, params

    def take_events(self) -> Iterable[Any]:
        return ()

    def get_kv_connector_stats(self) -> Optional[OrbitKVStats]:
        """The gate's counters since the last call (vLLM logs them as
        "KV Transfer metrics"); None on the worker side and when idle."""
        if self._sched is None:
            return None
        st = OrbitKVStats.of(self._sched.gate.take_stats(), self._sched.take_free_stats())
        return None if st.is_empty() else st

    @classmethod
    def build_kv_connector_stats(cls, data: Optional[dict] = None) -> Optional[OrbitKVStats]:
        return from_data(data)

    # --- worker side -------------------------------------------------------------

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        self.worker.register_kv_caches(kv_caches)

    def register_kv_planes(self, planes: Sequence[Sequence[Any]]) -> None:
        """Non-vLLM engines: per-layer (K, V) tensors with the block as dim 0."""
        self.worker.register_planes(planes)

    def _meta(self) -> OrbitKVMetadata:
        meta = self._get_connector_metadata()
        assert isinstance(meta, OrbitKVMetadata), type(meta)
        return meta

    def bind_connector_metadata(self, connector_metadata: Any) -> None:
        """Before anything in the step writes a block: wait for the saves that
        read blocks the step reuses (early_free: orbitkv.vllm.fences)."""
        super().bind_connector_metadata(connector_metadata)
        if self._worker is not None and isinstance(connector_metadata, OrbitKVMetadata):
            with self._trace.hook("begin_step"):
                self._worker.begin_step(connector_metadata)

    def build_connector_worker_meta(self) -> Any:
        """Released requests whose saves ended (SavesDone), None when none."""
        return self._worker.take_saves_done() if self._worker is not None else None

    def handle_preemptions(self, kv_connector_metadata: Any = None) -> None:
        """vLLM (0.26+) calls this with the step's metadata before it zeroes
        or copies any new block: the flush on reuse (begin_step) runs here
        first; bind_connector_metadata repeats it for vLLMs that do not."""
        with self._trace.hook("handle_preemptions"):
            if self._worker is not None and isinstance(kv_connector_metadata, OrbitKVMetadata):
                self._worker.begin_step(kv_connector_metadata)
            ids = getattr(kv_connector_metadata, "preempted", kv_connector_metadata) or ()
            self.worker.handle_preemptions(list(ids))

    def start_load_kv(self, forward_context: Any = None, **kwargs: Any) -> None:
        meta = self._meta()
        with self._trace.hook("start_load_kv"):
            if meta.preempted:
                self.worker.handle_preemptions(meta.preempted)
            self.worker.start_load_kv(meta, hooks_skipped=_hooks_skipped(forward_context))
        for spec in meta.loads:
            self._trace.note("load_start", spec.req_id)

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Layer-wise loads: a GPU-side wait on the layer's event; otherwise a
        # no-op (whole-request loads finish before the request computes).
        self.worker.wait_for_layer_load(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any = None, **kwargs: Any) -> None:
        return None  # saves start in wait_for_save, after every layer is written

    def wait_for_save(self) -> None:
        with self._trace.hook("wait_for_save"):
            self.worker.wait_for_save(self._meta())

    def get_finished(self, finished_req_ids: set[str]) -> tuple[Optional[set[str]], Optional[set[str]]]:
        sending, recving = self._results(finished_req_ids, "get_finished")
        return sending or None, recving or None

    def _results(self, finished_req_ids: set[str], hook: str) -> tuple[set[str], set[str]]:
        """The worker's step-end results; the step's trace line ends here."""
        with self._trace.hook(hook):
            sending, recving, _ = self.worker.get_results(list(finished_req_ids))
        for r in recving:
            self._trace.note("recving", r)
        self._trace.end_step()
        return sending, recving

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        """vLLM >= 0.29's step-end snapshot. A failed async load is reported
        finished receiving, its failed blocks by get_block_ids_with_load_errors
        (exact: from its first failed page on), and never in failed_recving:
        that is the request-level report for connectors that cannot name
        blocks, and vLLM 0.33 answers it by recomputing the whole request
        (num_computed_tokens = 0), discarding the pages that did load."""
        sending, recving = self._results(finished_req_ids, "get_transfer_results")
        return KVConnectorTransferResults(finished_sending=sending, finished_recving=recving)

    def get_block_ids_with_load_errors(self) -> set[int]:
        return self.worker.get_block_ids_with_load_errors()

    def shutdown(self) -> None:
        self._trace.close()
        if self._sched is not None:
            self._sched.shutdown()
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._client is not None:
            self._client.close()
            self._client = None
        if self._worker is not None:
            self._worker.shutdown()
