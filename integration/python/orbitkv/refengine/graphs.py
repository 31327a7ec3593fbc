"""Decode steps as CUDA graph replays (vLLM's FULL_DECODE_ONLY idea, in plain torch).

A decode-only step (every request computes one token and samples it) of n <= max(sizes)
requests is padded up to the next captured batch size p (1, 2, 4, 8) and to a context bucket,
then replays one ``torch.cuda.CUDAGraph`` per (p, bucket), captured on first use. Everything
the graph reads lives in one static int64 device buffer refilled by one host→device copy per
step; everything inside is fixed-shape and free of host syncs (``Qwen3Model.forward_decode``):

* padding rows are copies of row 0 (token, position, context) and write row 0's K/V into
  row 0's slot (``src``), so they change nothing and never attend to an empty context;
* ``sdpa``: contexts are packed one after another into L slots, L the bucket of the step's
  total context (256 · 2^k), read by the varlen flash kernel through cu_seqlens on the device
  (max_seqlen_k = L), or by dense masked math where that kernel is missing;
* ``exact``: each row runs C / chunk chunks, C the bucket of the longest context, masked past
  its length — the same matmul shapes as the eager exact path, so the same bits.

The bookkeeping (sizes, buckets, packing, the buffer's layout) is plain functions, tested on
the CPU; ``DecodeGraphs(capture=False)`` runs the same fixed-shape forward eagerly (CPU tests).
On first capture of a key the replay is checked against the eager fixed-shape run of the same
step: in exact mode any differing bit turns graphs off for the engine (batch invariance first).
"""

from __future__ import annotations

import bisect
import dataclasses
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .attention import PackedDecode, varlen_flash_usable
from .scheduler import cdiv


@dataclasses.dataclass(frozen=True)
class DecodeRow:
    """One request of a decode step: it computes `token` at `position` (context position + 1
    tokens, its own included) and samples the next one."""

    req_id: str
    token: int
    position: int
    block_ids: Sequence[int]  # at least cdiv(position + 1, block_size) blocks

    @property
    def context_len(self) -> int:
        return self.position + 1


def capture_size(n: int, sizes: Sequence[int]) -> Optional[int]:
    """The smallest captured batch size >= n (None: too many rows for any graph)."""
    i = bisect.bisect_left(list(sizes), n)
    return sizes[i] if n > 0 and i < len(sizes) else None


def buckets(base: int, bound: int) -> List[int]:
    """base, 2·base, 4·base, … up to the first >= bound (rounded up to a multiple of base)."""
    out, b = [], base
    while b < bound:
        out.append(b)
        b *= 2
    out.append(min(b, cdiv(bound, base) * base))
    return out


def bucket_for(n: int, bks: Sequence[int]) -> Optional[int]:
    i = bisect.bisect_left(list(bks), n)
    return bks[i] if i < len(bks) else None


@dataclasses.dataclass
class DecodeInputs:
    """Device views of the static buffer for one (batch size, bucket): what forward_decode reads."""

    tokens: torch.Tensor     # [p] int64
    positions: torch.Tensor  # [p] int64
    slots: torch.Tensor      # [p] int64: pool slot each row's K/V goes to
    src: torch.Tensor        # [p] int64: which row's K/V goes there (padding: 0)
    block_size: int
    seq_lens: Optional[torch.Tensor] = None  # exact: [p] int64
    tables: Optional[torch.Tensor] = None    # exact: [p, C / block_size] int64
    nchunks: int = 0                         # exact: C / chunk
    packed: Optional[PackedDecode] = None    # sdpa


class Layout:
    """Offsets of the static int64 buffer: five [P] vectors (tokens, positions, slots, src,
    seq_lens), cu_q and cu_k ([P+1] each), then the exact backend's [P, W] block tables or the
    sdpa backend's packed context slots [Lmax]. P = the largest captured size."""

    def __init__(self, exact: bool, max_size: int, block_size: int, max_context: int, chunk: int):
        self.exact, self.P, self.B = exact, max_size, block_size
        if exact:
            self.buckets = buckets(chunk, max_context)      # per-row context C
            self.chunk = chunk
            self.W = self.buckets[-1] // block_size
            tail = self.P * self.W
        else:
            self.buckets = buckets(256, max_size * max_context)  # the step's packed total L
            self.W = 0
            tail = self.buckets[-1]
        self.head = 5 * self.P + 2 * (self.P + 1)
        self.size = self.head + tail

    def key(self, rows: Sequence[DecodeRow], sizes: Sequence[int]) -> Optional[Tuple[int, int]]:
        """(p, bucket) of a step, or None when no graph covers it."""
        p = capture_size(len(rows), sizes)
        if p is None or p > self.P:
            return None
        if self.exact:
            need = max(r.context_len for r in rows)
        else:
            need = sum(r.context_len for r in rows) + (p - len(rows))
        b = bucket_for(need, self.buckets)
        return None if b is None else (p, b)

    def pack(self, rows: Sequence[DecodeRow], key: Tuple[int, int]) -> torch.Tensor:
        """The host int64 tensor to copy into buffer[:len]: rows padded to p with copies of
        row 0 (their K/V write: row 0's, into row 0's slot)."""
        p, bucket = key
        B, P = self.B, self.P
        n = len(rows)
        padded = list(rows) + [rows[0]] * (p - n)
        vec = torch.zeros(self.head, dtype=torch.int64)
        vec[0:p] = torch.tensor([r.token for r in padded])
        vec[P:P + p] = torch.tensor([r.position for r in padded])
        vec[2 * P:2 * P + p] = torch.tensor([_slot(r, B) for r in padded])
        vec[3 * P:3 * P + p] = torch.tensor(list(range(n)) + [0] * (p - n))
        vec[4 * P:4 * P + p] = torch.tensor([r.context_len for r in padded])
        cq, ck = 5 * P, 5 * P + P + 1
        vec[cq:cq + p + 1] = torch.arange(p + 1)
        if self.exact:
            tables = torch.zeros((P, self.W), dtype=torch.int64)
            for i, r in enumerate(padded):
                ids = list(r.block_ids[:cdiv(r.context_len, B)])
                tables[i, :len(ids)] = torch.tensor(ids, dtype=torch.int64)
            return torch.cat([vec, tables.flatten()])
        lens = [r.context_len for r in rows] + [1] * (p - n)  # padding rows: one key (row 0's own)
        vec[ck:ck + p + 1] = torch.tensor([0] + _cumsum(lens))
        ctx = torch.zeros(bucket, dtype=torch.int64)
        parts = [_context_slots(r, B) for r in rows] + [torch.tensor([_slot(rows[0], B)])] * (p - n)
        packed = torch.cat(parts)
        ctx[:packed.shape[0]] = packed
        return torch.cat([vec, ctx])

    def views(self, buf: torch.Tensor, key: Tuple[int, int]) -> DecodeInputs:
        """DecodeInputs for key over the static buffer (fixed addresses: a graph may keep them)."""
        p, bucket = key
        P = self.P
        d = DecodeInputs(tokens=buf[0:p], positions=buf[P:P + p], slots=buf[2 * P:2 * P + p],
                         src=buf[3 * P:3 * P + p], block_size=self.B)
        if self.exact:
            d.seq_lens = buf[4 * P:4 * P + p]
            d.tables = buf[self.head:].view(P, self.W)[:p, :bucket // self.B]
            d.nchunks = bucket // self.chunk
        else:
            cq, ck = 5 * P, 5 * P + P + 1
            d.packed = PackedDecode(ctx_slots=buf[self.head:self.head + bucket],
                                    cu_q=buf[cq:cq + p + 1], cu_k=buf[ck:ck + p + 1],  # int64 views
                                    max_k=bucket)
        return d


def _slot(r: DecodeRow, B: int) -> int:
    return r.block_ids[r.position // B] * B + r.position % B


def _context_slots(r: DecodeRow, B: int) -> torch.Tensor:
    table = torch.tensor(list(r.block_ids[:cdiv(r.context_len, B)]), dtype=torch.int64)
    return (table[:, None] * B + torch.arange(B)[None, :]).flatten()[:r.context_len]


def _cumsum(xs: Sequence[int]) -> List[int]:
    out, t = [], 0
    for x in xs:
        t += x
        out.append(t)
    return out


class _Captured:
    def __init__(self, graph, inputs: DecodeInputs, logits: torch.Tensor, tokens: torch.Tensor):
        self.graph, self.inputs, self.logits, self.tokens = graph, inputs, logits, tokens


class DecodeGraphs:
    """The model runner's decode path: run(rows, ...) → sampled tokens, through a captured
    graph per (padded batch size, bucket). capture=False: the same fixed-shape forward, eagerly
    (CPU, tests)."""

    def __init__(self, cfg, model, pool, capture: bool = True):
        self.cfg, self.model, self.pool = cfg, model, pool
        self.backend = cfg.resolved_attn_backend
        self.exact = self.backend == "exact"
        sizes = tuple(cfg.cuda_graph_sizes)
        top = capture_size(cfg.max_num_seqs, sizes) or sizes[-1]  # no graphs for batches that cannot occur
        self.sizes = tuple(x for x in sizes if x <= top)
        self.rows = cfg.resolved_invariant_rows
        self.device = torch.device(cfg.device)
        self.capture = capture
        self.layout = Layout(self.exact, self.sizes[-1], cfg.block_size, cfg.resolved_graph_max_context,
                             cfg.attn_chunk_tokens)
        self.buf = torch.zeros(self.layout.size, dtype=torch.int64, device=self.device)
        self.graphs: Dict[Tuple[int, int], _Captured] = {}
        self.mempool = None
        self.flash: Optional[bool] = None
        self.disabled: Optional[str] = None  # why graphs were turned off (replay != eager)
        self.stats = {"captures": 0, "replays": 0, "eager_fixed": 0}
        self.last_logits: Optional[torch.Tensor] = None  # [n, vocab] of the last step (tests)

    def capture_all(self, exact_max_chunks: int = 32) -> None:
        """Capture every (size, bucket) up front, largest first (the shared memory pool is
        sized once), as vLLM does at start, so that serving never pauses for a capture; exact
        mode only where size x chunks <= exact_max_chunks (its graphs grow with both), the rest
        on first use. Dummy rows (context 1: block 0's first slot, free at start) fill the
        buffer: a graph's shapes come from its key, not from the data."""
        if not self.capture:
            return
        t0 = time.perf_counter()
        keys = [(p, b) for p in self.sizes for b in self.layout.buckets
                if not self.exact or p * (b // self.layout.chunk) <= exact_max_chunks]
        for key in sorted(keys, reverse=True):
            if self.disabled is not None:
                break
            rows = [DecodeRow("", 0, 0, [0])] * key[0]
            host = self.layout.pack(rows, key)
            self.buf[:host.shape[0]].copy_(host)
            self._capture(key)
        print(f"refengine: captured {len(self.graphs)} decode graphs in {time.perf_counter() - t0:.1f} s"
              + (f"; graphs off: {self.disabled}" if self.disabled else ""), file=sys.stderr)

    def key(self, rows: Sequence[DecodeRow]) -> Optional[Tuple[int, int]]:
        if self.disabled is not None or not rows:
            return None
        return self.layout.key(rows, self.sizes)

    def run(self, rows: Sequence[DecodeRow], key: Tuple[int, int], hooks, meta) -> Optional[Dict[str, int]]:
        """One decode step (key = self.key(rows)): the layer hooks are called in layer order
        before (waits: GPU-side) and after (saves) the forward, which runs as one replay.
        None: this step's capture failed or did not match (graphs are off now; run it eagerly)."""
        n = len(rows)
        host = self.layout.pack(rows, key)
        self.buf[:host.shape[0]].copy_(host)
        layers = self.pool.layers
        for i in range(len(layers)):
            hooks.before_attention(i)
        if not self.capture:
            logits, tokens = self._body(self.layout.views(self.buf, key))
            self.stats["eager_fixed"] += 1
        else:
            cap = self.graphs.get(key)
            if cap is None:
                logits, tokens = self._capture(key)
                if logits is None:
                    return None  # graphs are off now: the caller runs this step eagerly
            else:
                cap.graph.replay()
                logits, tokens = cap.logits, cap.tokens
                self.stats["replays"] += 1
        for i in range(len(layers)):
            hooks.after_attention(i, layers[i], meta)
        self.last_logits = logits[:n]
        return dict(zip((r.req_id for r in rows), tokens[:n].tolist()))

    def _body(self, inputs: DecodeInputs):
        if self.flash is None:
            self.flash = (not self.exact and self.device.type == "cuda"
                          and varlen_flash_usable(self._probe_q(), self.cfg.model.num_kv_heads))
        return self.model.forward_decode(inputs, self.pool.layers, self.backend, self.cfg.attn_chunk_tokens,
                                         self.rows, self.flash)

    def _probe_q(self) -> torch.Tensor:
        m = self.cfg.model
        return torch.zeros((1, m.num_q_heads, m.head_dim), dtype=m.torch_dtype, device=self.device)

    def _capture(self, key):
        """Capture key's graph from the step in the buffer (see _capture_checked); any
        failure turns graphs off for the engine (eager steps from then on), never the engine."""
        try:
            return self._capture_checked(key)
        except Exception as e:  # noqa: BLE001 — a capture problem must not stop serving
            self.disabled = f"capture of {key} failed ({type(e).__name__}: {e})"
            print(f"refengine: CUDA graphs off: {self.disabled}", file=sys.stderr)
            return None, None

    def _capture_checked(self, key):
        """Warm up on a side stream (the real step: its K/V writes are the same values the
        replay writes again), capture, replay, and check the replay against the warm-up."""
        inputs = self.layout.views(self.buf, key)
        cur = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(cur)
        with torch.cuda.stream(side):
            for _ in range(2):
                ref_logits, ref_tokens = self._body(inputs)
        cur.wait_stream(side)
        ref_logits, ref_tokens = ref_logits.clone(), ref_tokens.clone()
        if self.mempool is None:
            self.mempool = torch.cuda.graph_pool_handle()
        try:
            g, logits, tokens = self._record(inputs)
        except RuntimeError as e:
            if not self.flash:
                raise
            # the flash op would not capture here: the same attention as masked math
            print(f"refengine: decode graphs without the varlen flash kernel (capture failed: {e})",
                  file=sys.stderr)
            self.flash = False
            return self._capture_checked(key)
        self.stats["captures"] += 1
        why = self._compare(key, logits, ref_logits)
        if why is not None:
            self.disabled = why
            print(f"refengine: CUDA graphs off: {why}", file=sys.stderr)
            return None, None
        self.graphs[key] = _Captured(g, inputs, logits, tokens)
        return logits, tokens

    def _record(self, inputs: DecodeInputs):
        g = torch.cuda.CUDAGraph()
        with _graph(g, self.mempool):
            logits, tokens = self._body(inputs)
        g.replay()
        return g, logits, tokens

    def _compare(self, key, got: torch.Tensor, want: torch.Tensor) -> Optional[str]:
        if torch.equal(got, want):
            return None
        err = (got - want).abs().max().item()
        if self.exact:
            return (f"the replay of decode batch {key[0]} (context bucket {key[1]}) differs from the eager "
                    f"step (max |diff| {err:.3g}); exact mode needs the same bits (batch invariance)")
        scale = want.abs().max().item() or 1.0
        if err > 1e-2 * scale:
            return f"the replay of decode batch {key[0]} (bucket {key[1]}) differs from the eager step by {err:.3g}"
        print(f"refengine: decode graph {key}: replay within {err:.3g} of the eager step (sdpa: not bit-exact)",
              file=sys.stderr)
        return None


def _graph(g, pool):
    """torch.cuda.graph with errors scoped to this thread where torch has the option (2.1+):
    other threads (a connector's) may use CUDA meanwhile."""
    try:
        return torch.cuda.graph(g, pool=pool, capture_error_mode="thread_local")
    except TypeError:
        return torch.cuda.graph(g, pool=pool)
