"""The model runner: one step's forward, driving the worker half of a KV connector.

Per step, in vLLM's order (research/engine-apis.md §1.3 step 4): handle_preemptions (when
requests were preempted) → bind_connector_metadata → start_load_kv → per layer
wait_for_layer_load / write K,V / attention / save_kv_layer → wait_for_save →
get_transfer_results (or get_finished) → get_block_ids_with_load_errors →
clear_connector_metadata. A step with no tokens still runs the connector calls.
"""

from __future__ import annotations

import time
import types
from typing import Any, Dict, Optional, Set, Tuple

import torch

from .attention import BatchMeta, SeqSpan, VarlenPlan
from .config import EngineConfig
from .connector import KVConnectorOutput
from .graphs import DecodeGraphs, DecodeRow
from .kvpool import KVPool, layer_name
from .model import LayerHooks, Qwen3Model
from .scheduler import SchedulerOutput, cdiv


_FULL_GRAPH = types.SimpleNamespace(name="FULL")  # vLLM's CUDAGraphMode.FULL, by name


class _ConnectorHooks(LayerHooks):
    def __init__(self, connector: Any):
        self.connector = connector
        self.marks: Optional[list] = None  # tracing: a CUDA timing event per layer, after its load wait

    def before_attention(self, layer: int) -> None:
        self.connector.wait_for_layer_load(layer_name(layer))
        if self.marks is not None:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            self.marks.append(ev)

    def after_attention(self, layer: int, kv: torch.Tensor, meta: BatchMeta) -> None:
        self.connector.save_kv_layer(layer_name(layer), kv, meta)


class ModelRunner:
    def __init__(self, cfg: EngineConfig, model: Qwen3Model, pool: KVPool, connector: Any = None):
        self.cfg = cfg
        self.model = model
        self.pool = pool
        self.connector = connector
        self.backend = cfg.resolved_attn_backend
        self.device = torch.device(cfg.device)
        self.hooks = _ConnectorHooks(connector) if connector is not None else LayerHooks()
        if connector is not None:
            connector.register_kv_caches(pool.kv_caches())
        # Decode-only steps of up to max(cuda_graph_sizes) requests as CUDA graph replays
        # (graphs.py); use_graphs switches them off at run time (step-time probe).
        self.graphs = DecodeGraphs(cfg, model, pool) if cfg.resolved_cuda_graphs else None
        self.use_graphs = True
        if self.graphs is not None:
            self.graphs.capture_all()
        # Instrumentation (cheap): per connector step, the CPU time of its phases; with
        # trace_layers (CUDA), also when the GPU got past each layer's load wait.
        self.timings: list = []
        self.trace_layers = False

    def execute(self, so: SchedulerOutput) -> Tuple[Dict[str, int], Optional[KVConnectorOutput]]:
        """Run one step; returns (request id → sampled token, connector output)."""
        conn = self.connector
        graph = self._graph_step(so)
        # a graph step builds no eager batch unless a connector wants its attention metadata
        batch = self._build(so, plan=graph is None) if so.seqs and (graph is None or conn is not None) else None
        if conn is None:
            return (self._run(so, batch, graph) if so.seqs else {}), None
        if so.preempted_req_ids and hasattr(conn, "handle_preemptions"):
            conn.handle_preemptions(so.kv_connector_metadata)
        conn.bind_connector_metadata(so.kv_connector_metadata)
        trace = bool(batch) and self.trace_layers and self.device.type == "cuda"
        t0 = time.perf_counter()
        if trace:
            start_ev = torch.cuda.Event(enable_timing=True)
            start_ev.record()
            self.hooks.marks = []
        try:
            conn.start_load_kv(self._forward_context(batch[1] if batch else None, graph is not None))
            t1 = time.perf_counter()
            sampled = self._run(so, batch, graph) if so.seqs else {}
            if batch and self.device.type == "cuda":
                # The peer copies saved blocks with its own stream in its own
                # process: the step's KV writes must have landed first.
                torch.cuda.current_stream(self.device).synchronize()
            t2 = time.perf_counter()
            conn.wait_for_save()
            sending, recving, failed = self._transfer_results(so.finished_req_ids)
            invalid = set(conn.get_block_ids_with_load_errors() or ())
            t3 = time.perf_counter()
        finally:
            conn.clear_connector_metadata()
            marks, self.hooks.marks = self.hooks.marks, None
        if batch:
            rec = {"start_load_s": t1 - t0, "forward_s": t2 - t1, "results_s": t3 - t2,
                   "tokens": so.total_num_scheduled_tokens}
            if trace and marks:
                ms = [start_ev.elapsed_time(ev) for ev in marks]  # the step's kernels are done (synchronized)
                rec["gpu_layer_ready_ms"] = [round(x, 3) for x in ms]
            self.timings.append(rec)
            del self.timings[:-256]
        wmeta = self.connector.build_connector_worker_meta() if hasattr(self.connector, "build_connector_worker_meta") else None
        return sampled, KVConnectorOutput(finished_sending=sending, finished_recving=recving,
                                          failed_recving=failed, invalid_block_ids=invalid,
                                          kv_connector_worker_meta=wmeta)

    def _transfer_results(self, finished: Set[str]):
        conn = self.connector
        if hasattr(conn, "get_transfer_results"):
            r = conn.get_transfer_results(set(finished))
            return (getattr(r, "finished_sending", None), getattr(r, "finished_recving", None),
                    getattr(r, "failed_recving", None))
        if hasattr(conn, "get_finished"):
            sending, recving = conn.get_finished(set(finished))
            return sending, recving, None
        return None, None, None

    def _forward_context(self, meta: Optional[BatchMeta], graph: bool = False):
        """What vLLM passes start_load_kv; a decode step replayed as a CUDA graph
        says FULL (as vLLM's runner does), since its layers call no connector hook."""
        layers = {name: types.SimpleNamespace(kv_cache=[t], layer_name=name)
                  for name, t in self.pool.kv_caches().items()}
        return types.SimpleNamespace(no_compile_layers=layers, attn_metadata=meta, virtual_engine=0,
                                     cudagraph_runtime_mode=_FULL_GRAPH if graph else None)

    def _graph_step(self, so: SchedulerOutput):
        """(rows, key) when this step replays a decode graph: graphs on, every request
        decoding one token it samples, a captured size and bucket covering it, no layer trace."""
        g = self.graphs
        if g is None or not self.use_graphs or not so.seqs or (self.trace_layers and self.connector is not None):
            return None
        if any(s.num_tokens != 1 or not s.samples for s in so.seqs):
            return None
        B = self.cfg.block_size
        rows = [DecodeRow(s.request.request_id, s.request.all_token_ids[s.start], s.start,
                          s.block_ids[:cdiv(s.start + 1, B)]) for s in so.seqs]
        key = g.key(rows)
        return None if key is None else (rows, key)

    def _run(self, so: SchedulerOutput, batch, graph) -> Dict[str, int]:
        if graph is not None:
            out = self.graphs.run(graph[0], graph[1], self.hooks, batch[1] if batch else None)
            if out is not None:
                return out
            batch = batch or self._build(so)  # graphs turned off at this step's capture
        return self._forward(*batch)

    def _build(self, so: SchedulerOutput, plan: bool = True):
        """The step's tensors, assembled on the host and moved to the device in one copy (an
        int64 buffer sliced into views); for the sdpa backend also the step's VarlenPlan
        (unless plan=False: a graph step, whose metadata only the connector reads)."""
        B = self.cfg.block_size
        tokens, positions, slots, tables, logits_rows, sample_ids = [], [], [], [], [], []
        ctx, q_starts, k_starts, spans = [], [0], [0], []
        planned = self.backend != "exact" and plan
        arange_b = torch.arange(B, dtype=torch.int64)
        off = 0
        for s in so.seqs:
            req, start, n = s.request, s.start, s.num_tokens
            table = torch.tensor(s.block_ids[:cdiv(start + n, B)], dtype=torch.int64)
            pos = torch.arange(start, start + n, dtype=torch.int64)
            tokens.append(torch.tensor(req.all_token_ids[start:start + n], dtype=torch.int64))
            positions.append(pos)
            slots.append(table[pos // B] * B + pos % B)
            tables.append(table)
            spans.append((off, off + n, start + n))
            if planned:
                ctx.append((table[:, None] * B + arange_b[None, :]).flatten()[:start + n])
                q_starts.append(off + n)
                k_starts.append(k_starts[-1] + start + n)
            if s.samples:
                logits_rows.append(off + n - 1)
                sample_ids.append(req.request_id)
            off += n
        parts = [torch.cat(tokens), torch.cat(positions), torch.cat(slots),
                 torch.tensor(logits_rows, dtype=torch.int64)] + tables
        if planned:
            parts += [torch.cat(ctx), torch.tensor(q_starts + k_starts, dtype=torch.int64)]
        flat = torch.cat(parts).to(self.device)
        views = list(flat.split([p.shape[0] for p in parts]))
        tok, pos_d, slot_d, logit_d = views[:4]
        seqs = [SeqSpan(a, b, L, t) for (a, b, L), t in zip(spans, views[4:4 + len(tables)])]
        meta = BatchMeta(slot_mapping=slot_d, positions=pos_d, seqs=seqs, block_size=B, logits_indices=logit_d)
        if planned:
            cu = views[-1].to(torch.int32)
            S = len(so.seqs)
            meta.plan = VarlenPlan(views[-2], cu[:S + 1], cu[S + 1:], k_starts,
                                   max(b - a for a, b, _ in spans), max(L for _, _, L in spans))
        return tok, meta, sample_ids

    def _forward(self, tokens: torch.Tensor, meta: BatchMeta, sample_ids) -> Dict[str, int]:
        logits = self.model.forward(tokens, meta, self.pool.layers, self.backend,
                                    self.cfg.attn_chunk_tokens, self.hooks, rows=self.cfg.resolved_invariant_rows)
        if not sample_ids:
            return {}
        return dict(zip(sample_ids, logits.argmax(-1).tolist()))
