"""vLLM's own Scheduler driving the OrbitKV connector, with a synthetic model
runner (the way vLLM's tests/v1/kv_connector/unit harness does it, but with
real KV bytes).

The harness builds a VllmConfig for a local model directory (config.json
only, no tokenizer, no weights), vLLM's real ``Scheduler`` (which creates the
connector's scheduler half through vLLM's KVConnectorFactory) and a worker
half over per-layer KV tensors in vLLM 0.26's packed NHD layout, in a shared
memory file the peer maps. Each ``step`` is what the installed vLLM's GPU model runner does
around a forward: bind the metadata, start loads ("compute" first on a vLLM
that starts them after the forward, unless the step has sync loads), start
saves, collect finished transfers and failed blocks, and hand the result back to
``Scheduler.update_from_output``.

The "model" writes, for every scheduled token, K|V values that are a pure
function of the token sequence up to and including it, and before that
checks that every block the request already counts as computed (locally
cached, restored by OrbitKV, or computed in an earlier step) holds exactly
what the model would have written there — so a restore into the wrong
block, a stale page or a wrong byte fails the test where attention would
have read it. Sampled tokens are a pure function of the sequence too, so
outputs can be compared with a run without the connector.

Needs vLLM installed (make test installs it into its own environment).
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import tempfile
import time
from typing import Any, Optional

import torch

from vllm.config import CacheConfig, DeviceConfig, KVTransferConfig, ModelConfig, SchedulerConfig, VllmConfig
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1, KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request, RequestStatus
from vllm.v1.structured_output import StructuredOutputManager

from orbitkv.vllm import OrbitKVConnector

# What the installed vLLM's model runner calls at a step's end: get_transfer_results
# (>= 0.29: KVConnectorOutput carries failed_recving) or get_finished (0.26).
_TRANSFER_RESULTS = hasattr(KVConnectorBase_V1, "get_transfer_results") and \
    "failed_recving" in getattr(KVConnectorOutput, "__dataclass_fields__", {})

MODEL_DIR = os.path.join(os.path.dirname(__file__), "..", "..", "models", "qwen3-tiny")
LAYERS, KV_HEADS, HEAD_DIM = 2, 2, 32  # qwen3-tiny/config.json
VOCAB = 1024


@dataclasses.dataclass
class Finished:
    req_id: str
    tokens: list[int]
    reason: str
    kv_transfer_params: Optional[dict] = None  # what vLLM returns to the client (a P/D producer's handoff)


class Harness:
    """vLLM's Scheduler + the connector's worker half + a synthetic runner."""

    def __init__(self, socket: str, *, num_blocks: int, block_size: int = 16, max_batched: int = 16384,
                 max_seqs: int = 16, policy: str = "fcfs", connector: bool = True, extra: Optional[dict] = None,
                 failure_policy: str = "recompute", zero_new_blocks: bool = False) -> None:
        self.block_size, self.num_blocks = block_size, num_blocks
        # vLLM zeroes a step's newly allocated blocks (in _update_states, after
        # handle_preemptions and before bind_connector_metadata) for backends
        # that need it (Scheduler.needs_kv_cache_zeroing): the harness can too.
        self.zero_new_blocks = zero_new_blocks
        self.vllm_config = _vllm_config(socket, block_size, max_batched, max_seqs, policy, connector, extra or {},
                                        failure_policy)
        self.vllm_config.cache_config.num_gpu_blocks = num_blocks
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=KV_HEADS, head_size=HEAD_DIM,
                                 dtype=torch.float32)
        layer_names = [f"model.layers.{i}.self_attn.attn" for i in range(LAYERS)]
        self.kv_cache_config = KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                                             kv_cache_groups=[KVCacheGroupSpec(layer_names, spec)])
        self.scheduler = Scheduler(vllm_config=self.vllm_config, kv_cache_config=self.kv_cache_config,
                                   structured_output_manager=StructuredOutputManager(self.vllm_config),
                                   block_size=block_size, log_stats=True)
        init_none_hash(sha256)
        self._hasher = get_request_block_hasher(block_size, sha256)
        self._shm = tempfile.NamedTemporaryFile(prefix="okv-vllm-", dir="/dev/shm")
        nbytes = LAYERS * num_blocks * block_size * KV_HEADS * 2 * HEAD_DIM * 4
        pool = torch.from_file(self._shm.name, shared=True, size=nbytes // 4, dtype=torch.float32)
        # vLLM 0.26 FLASH_ATTN, NHD: memory (blocks, block_size, heads, 2*head_dim), logical (blocks, heads, block_size, 2*head_dim)
        self.phys = pool.view(LAYERS, num_blocks, block_size, KV_HEADS, 2 * HEAD_DIM)
        self.phys.fill_(float("nan"))
        self.kv = {n: self.phys[i].permute(0, 2, 1, 3) for i, n in enumerate(layer_names)}
        self.worker: Optional[OrbitKVConnector] = None
        if connector:
            self.worker = OrbitKVConnector(self.vllm_config, KVConnectorRole.WORKER, self.kv_cache_config)
            self.worker.register_kv_caches(self.kv)
        self._blocks: dict[str, list[int]] = {}
        self.finished: dict[str, Finished] = {}
        self._out: dict[str, list[int]] = {}  # output tokens so far, per request
        self.steps = 0
        self.checked_tokens = 0  # tokens whose KV was verified before a step computed on them
        self.preempted = 0  # requests vLLM preempted
        self.scheduled_tokens = 0  # tokens vLLM scheduled to compute
        self.failed_blocks = 0  # blocks the worker reported failed to load
        self.loaded_pages = 0  # pages the connector's metadata asked the worker to load
        self.failed_recving: set[str] = set()  # requests the worker reported in failed_recving (vLLM >= 0.29)

    # --- requests ----------------------------------------------------------------

    def add(self, req_id: str, prompt: list[int], max_tokens: int = 2, priority: int = 0,
            kv_transfer_params: Optional[dict] = None, **extras: Any) -> Request:
        """``extras``: what else vLLM's Request takes and keys its prefix cache
        on (lora_request, mm_features, cache_salt); with mm_features the
        scheduler gets an encoder budget (use_mm) — the synthetic runner
        computes no encoder output, only the placeholders' KV."""
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=True, temperature=0.0)
        if extras.get("mm_features"):
            self.use_mm()
        req = Request(request_id=req_id, prompt_token_ids=list(prompt), sampling_params=sp, pooling_params=None,
                      priority=priority, block_hasher=self._hasher, **extras)
        if kv_transfer_params is not None:  # what vLLM's API server passes in from the request body
            req.kv_transfer_params = kv_transfer_params
        self.scheduler.add_request(req)
        return req

    def use_mm(self, budget: int = 1 << 20) -> None:
        """An encoder cache and budget for multimodal requests (the text-only
        test model gets none from vLLM, which would never schedule their
        placeholder tokens)."""
        from vllm.v1.core.encoder_cache_manager import EncoderCacheManager

        sch = self.scheduler
        if sch.max_num_encoder_input_tokens < budget:
            sch.encoder_cache_manager = EncoderCacheManager(cache_size=budget)
            sch.max_num_encoder_input_tokens = budget

    def abort(self, req_id: str) -> None:
        self.scheduler.finish_requests(req_id, RequestStatus.FINISHED_ABORTED)

    @property
    def connector(self) -> Any:
        """The scheduler half vLLM created (None without a connector)."""
        return self.scheduler.connector

    def record_hits_by_source(self) -> list[tuple[int, dict]]:
        """From now on, per external hit vLLM's scheduler records (vLLM >= 0.33):
        (tokens, the tokens it counts by source, as CacheHitSource values) —
        the change in its connector prefix-cache stats' hits_by_source, what
        vllm:prompt_tokens_cached_by_source_total counts (vLLM counts a split
        that does not sum to the hit as external_unspecified)."""
        stats = self.scheduler.connector_prefix_cache_stats
        assert stats is not None
        seen: list[tuple[int, dict]] = []
        record = stats.record

        def spy(num_tokens, num_hits, preempted, hits_by_source=None):
            before = dict(stats.hits_by_source)
            record(num_tokens, num_hits, preempted, hits_by_source)
            after = {getattr(k, "value", k): v - before.get(k, 0) for k, v in stats.hits_by_source.items()}
            seen.append((num_hits, {k: v for k, v in after.items() if v}))

        stats.record = spy
        return seen

    # --- one engine step ----------------------------------------------------------

    def step(self, before_load=None) -> Any:
        """One engine step; ``before_load()`` runs after scheduling, before the
        worker starts the step's loads (to inject a fault between the two)."""
        so = self.scheduler.schedule()
        self.steps += 1
        self.scheduled_tokens += so.total_num_scheduled_tokens
        self._track_blocks(so)
        w = self.worker
        meta = so.kv_connector_metadata
        self.preempted += len(so.preempted_req_ids or ())
        if meta is not None:
            self.loaded_pages += sum(len(spec) for spec in meta.loads)
        if before_load is not None:
            before_load()
        # vLLM >= 0.29 starts the step's loads after its forward unless the step
        # reads KV loaded in it (SchedulerOutput.has_sync_kv_loads); 0.26 before it.
        loads_first = getattr(so, "has_sync_kv_loads", True)
        if w is not None:
            w.handle_preemptions(meta)
            if self.zero_new_blocks:
                self._zero_new_blocks(so)
            w.bind_connector_metadata(meta)
            if loads_first:
                w.start_load_kv(None)
        sampled = self._forward(so)
        kvo = None
        if w is not None:
            if not loads_first:
                w.start_load_kv(None)
            w.wait_for_save()
            failed: dict[str, Any] = {}
            if _TRANSFER_RESULTS:  # vLLM >= 0.29: one snapshot, with the failed receives
                res = w.get_transfer_results(so.finished_req_ids)
                sending, recving = res.finished_sending or None, res.finished_recving or None
                failed = {"failed_recving": set(res.failed_recving or ())}
                self.failed_recving |= failed["failed_recving"]
            else:
                sending, recving = w.get_finished(so.finished_req_ids)
            invalid = w.get_block_ids_with_load_errors()
            self.failed_blocks += len(invalid)
            wmeta = w.build_connector_worker_meta()  # as vLLM's runners do: the step's worker metadata
            kvo = KVConnectorOutput(finished_sending=sending, finished_recving=recving, invalid_block_ids=invalid,
                                    kv_connector_worker_meta=wmeta, **failed)
            w.clear_connector_metadata()
        ids = list(sampled)
        mro = ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in enumerate(ids)},
                                sampled_token_ids=[sampled[r] for r in ids], kv_connector_output=kvo)
        outs = self.scheduler.update_from_output(so, mro)
        for eco in outs.values():
            for o in eco.outputs:
                toks = self._out.setdefault(o.request_id, [])
                toks.extend(o.new_token_ids)
                if o.finish_reason is not None:
                    self.finished[o.request_id] = Finished(o.request_id, list(toks), str(o.finish_reason),
                                                           getattr(o, "kv_transfer_params", None))
        return so

    def run(self, max_steps: int = 100000) -> int:
        """Steps until every request finished and every transfer ended, at
        most max_steps; returns the steps taken. Never bounded by elapsed
        time (a busy machine only makes it slower): a step that schedules
        nothing while transfers are in flight waits for one of them to end
        (each is bounded by the connector's own deadlines), so the steps a
        run takes do not depend on the machine's speed either."""
        for i in range(max_steps):
            if not self.scheduler.has_requests() and self._idle():
                return i
            so = self.step()
            if so.total_num_scheduled_tokens == 0:
                self.wait_for_transfer()
        return max_steps

    def wait_for_transfer(self, idle_s: float = 0.001) -> None:
        """Blocks until one of the worker's loads or saves in flight ends (at
        once when one has); with none in flight, idle_s: what the engine waits
        for then is the connector's own clock (a P/D consumer's pd_wait_ms, a
        deferral's retry), which idle steps must not outrun by spinning."""
        futs = []
        if self.worker is not None:
            w = self.worker.worker
            with w._lock:
                futs = [st.future for st in w._loads.values()] + [f for fs in w._saves.values() for f in fs]
        if not futs:
            time.sleep(idle_s)
        elif not any(f.done() for f in futs):
            cf.wait(futs, return_when=cf.FIRST_COMPLETED)

    def _idle(self) -> bool:
        return self.worker is None or not (self.worker.worker._loads or self.worker.worker._saves)

    def close(self) -> None:
        if self.worker is not None:
            self.worker.shutdown()
        if self.scheduler.connector is not None:
            self.scheduler.connector.shutdown()
        self._shm.close()

    # --- the synthetic model runner ----------------------------------------------

    def _track_blocks(self, so: Any) -> None:
        for nr in so.scheduled_new_reqs:
            self._blocks[nr.req_id] = list(nr.block_ids[0])
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            new = cr.new_block_ids[i]
            if rid in cr.resumed_req_ids:
                self._blocks[rid] = list(new[0]) if new else []
            elif new:
                self._blocks.setdefault(rid, []).extend(new[0])
        for rid in so.finished_req_ids:
            self._blocks.pop(rid, None)

    def _zero_new_blocks(self, so: Any) -> None:
        """Zero the blocks the step newly allocates, as vLLM's runner does
        where the backend needs it: a new request's blocks past its own
        prefix-cache hits, and a running request's new blocks."""
        ids: list[int] = []
        for nr in so.scheduled_new_reqs:
            ids += list(nr.block_ids[0])[int(nr.num_computed_tokens) // self.block_size:]
        for new in getattr(so.scheduled_cached_reqs, "new_block_ids", None) or ():
            if new is not None:
                ids += list(new[0])
        if ids:
            self.phys[:, torch.tensor(ids, dtype=torch.long)] = 0

    def _forward(self, so: Any) -> dict[str, list[int]]:
        sampled: dict[str, list[int]] = {}
        for rid, n in so.num_scheduled_tokens.items():
            req = self.scheduler.requests[rid]
            start = req.num_computed_tokens  # already advanced by schedule(): the tokens before this step
            start -= n
            tokens = list(req.all_token_ids)
            self._check(rid, tokens, start)
            self._write(rid, tokens, start, start + n)
            if start + n >= req.num_prompt_tokens:
                sampled[rid] = [self._sample(rid, tokens, start + n)]
            else:
                sampled[rid] = []
        return sampled

    def _sample(self, rid: str, tokens: list[int], upto: int) -> int:
        """The next token, read from the cache the way attention reads it:
        a function of every stored K|V value of the sequence (layer 0), so an
        output depends on the bytes in the blocks, restored ones included."""
        b, off = self._slots(rid, 0, upto)
        stored = self.phys[0][b, off].to(torch.float64).sum().item()
        return (int(stored) ^ next_token(tokens[:upto])) % VOCAB

    def _slots(self, rid: str, lo: int, hi: int) -> tuple[torch.Tensor, torch.Tensor]:
        blocks = self._blocks[rid]
        pos = torch.arange(lo, hi)
        b = torch.tensor([blocks[p // self.block_size] for p in range(lo, hi)], dtype=torch.long)
        return b, pos % self.block_size

    def _check(self, rid: str, tokens: list[int], upto: int) -> None:
        if upto <= 0:
            return
        b, off = self._slots(rid, 0, upto)
        want = kv_values(tokens[:upto])
        for layer in range(LAYERS):
            got = self.phys[layer][b, off]
            bad = ~torch.all((got == want + layer), dim=(1, 2))
            if bool(bad.any()):
                first = int(bad.nonzero()[0])
                raise AssertionError(f"request {rid}: layer {layer} token {first} (block {int(b[first])}) holds "
                                     f"the wrong KV before step {self.steps}")
        self.checked_tokens += upto

    def _write(self, rid: str, tokens: list[int], lo: int, hi: int) -> None:
        b, off = self._slots(rid, lo, hi)
        vals = kv_values(tokens[:hi])[lo:]
        for layer in range(LAYERS):
            self.phys[layer][b, off] = vals + layer


def prefix_hashes(tokens: list[int]) -> torch.Tensor:
    """A rolling hash of every prefix: h[i] depends on tokens[0..i]."""
    out, h = [], 0x9E3779B1
    for t in tokens:
        h = (h * 1000003 ^ (t + 1)) & 0xFFFFFF
        out.append(h)
    return torch.tensor(out, dtype=torch.int64)


def kv_values(tokens: list[int]) -> torch.Tensor:
    """(len, heads, 2*head_dim) float32 values exactly representable in fp32."""
    h = prefix_hashes(tokens).view(-1, 1, 1)
    lane = torch.arange(KV_HEADS * 2 * HEAD_DIM, dtype=torch.int64).view(1, KV_HEADS, 2 * HEAD_DIM)
    return ((h * (lane + 1)) % 65521).to(torch.float32)


def next_token(tokens: list[int]) -> int:
    return int(prefix_hashes(tokens[-64:])[-1]) % VOCAB


def _loads(extra: dict) -> dict:
    """The tests' extra config: async loads unless a test says otherwise or asks
    for the connector's own default (``"async_load": None``: sync loads on vLLM
    >= 0.29, orbitkv.vllm.config.default_async_load). The scheduling paths these
    tests drive are written for async loads, the default before 0.29."""
    out = {"async_load": True, **extra}
    if out["async_load"] is None:
        del out["async_load"]
    return out


def _vllm_config(socket: str, block_size: int, max_batched: int, max_seqs: int, policy: str, connector: bool,
                 extra: dict, failure_policy: str) -> VllmConfig:
    mc = ModelConfig(model=os.path.abspath(MODEL_DIR), skip_tokenizer_init=True, dtype="float32", seed=42,
                     max_model_len=16384)
    sc = SchedulerConfig(max_num_seqs=max_seqs, max_num_batched_tokens=max_batched, max_model_len=16384,
                         enable_chunked_prefill=True, is_encoder_decoder=False, policy=policy)
    cc = CacheConfig(block_size=block_size, enable_prefix_caching=True)
    kvt = None
    if connector:
        kvt = KVTransferConfig(kv_connector="OrbitKVConnector", kv_connector_module_path="orbitkv.vllm",
                               kv_role=extra.get("kv_role", "kv_both"), kv_load_failure_policy=failure_policy,
                               kv_connector_extra_config={"socket": socket, "load_deadline_ms": 5000,
                                                          "save_deadline_ms": 5000, **_loads(extra)})
    return VllmConfig(model_config=mc, cache_config=cc, scheduler_config=sc, kv_transfer_config=kvt,
                      device_config=DeviceConfig("cpu"))
