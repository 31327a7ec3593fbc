"""Paged attention over vLLM-FlashAttention-layout KV tensors, in plain torch.

Two backends read K/V through block tables:

* ``exact`` — for CPU fp32. A query's result depends only on its own q, its position and the
  K/V values of its context, never on which other tokens share the step: keys are consumed in
  fixed chunks of ``chunk`` absolute positions with an online softmax, every reduction runs
  over a fixed length (head_dim or ``chunk``), and chunks past a query's position are exact
  no-ops (scale 1, add 0). So a prefill whose first blocks were restored from a cache, a
  chunked prefill and a batched decode give bit-identical logits to one full prefill, as long
  as the platform's matmul computes each output row independently of the row count (checked
  by the tests).
* ``sdpa`` — for CUDA. With a step's `VarlenPlan` (built once per step by the model runner),
  one ``index_select`` per layer gathers the context K/V of every request of the step
  (K and V planes together) and ONE variable-length flash-attention call
  (``torch.ops.aten._flash_attention_forward``: GQA-native, causal aligned bottom-right per
  request, so a few new queries over a long cached context need no mask and no K/V repeat)
  covers the whole batch. That private op is feature-detected and checked against the math
  reference once per (device, dtype, heads) before first use; where it is missing (torch 1.x,
  CPU, fp32) or disagrees, each request's context goes through
  ``torch.nn.functional.scaled_dot_product_attention`` (or the same math unfused) instead.
  ``ORBITKV_REFENGINE_VARLEN=0`` forces that per-request path.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
from typing import Dict, List, Optional, Tuple

import torch
import torch.nn.functional as F


@dataclasses.dataclass
class SeqSpan:
    """One request's part of a step: queries q[start:end], context of `context_len` tokens."""

    start: int
    end: int
    context_len: int
    block_table: torch.Tensor  # int64 block ids covering context_len tokens


@dataclasses.dataclass
class BatchMeta:
    """Attention metadata of a step (what save_kv_layer receives as attn_metadata)."""

    slot_mapping: torch.Tensor   # [T] int64: block_id * block_size + offset of each new token
    positions: torch.Tensor      # [T] int64
    seqs: List[SeqSpan]
    block_size: int
    logits_indices: torch.Tensor  # [R'] rows whose logits are sampled
    plan: Optional["VarlenPlan"] = None  # sdpa backend: the step's gather/varlen metadata

    @property
    def num_tokens(self) -> int:
        return int(self.slot_mapping.shape[0])


@dataclasses.dataclass
class VarlenPlan:
    """A step's context layout for the sdpa backend, computed once per step (not per layer):
    the requests' contexts packed one after another, in step order."""

    ctx_slots: torch.Tensor  # [sum(context_len)] int64: pool slot of each context token
    cu_q: torch.Tensor       # [S+1] int32: query offsets (FlashAttention's cu_seqlens_q)
    cu_k: torch.Tensor       # [S+1] int32: context offsets into ctx_slots
    k_starts: List[int]      # cu_k on the host, for the per-request fallback
    max_q: int
    max_k: int


def plan_from_meta(meta: BatchMeta) -> VarlenPlan:
    """The plan from a BatchMeta's spans (the model runner builds it cheaper, see worker)."""
    B = meta.block_size
    dev = meta.slot_mapping.device
    slots, k_starts, q_starts = [], [0], [0]
    for s in meta.seqs:
        table = s.block_table.to(dev)
        slots.append((table[:, None] * B + torch.arange(B, device=dev)[None, :]).flatten()[:s.context_len])
        k_starts.append(k_starts[-1] + s.context_len)
        q_starts.append(s.end)
    cu = torch.tensor(q_starts + k_starts, dtype=torch.int32).to(dev)
    n = len(q_starts)
    return VarlenPlan(torch.cat(slots), cu[:n], cu[n:], k_starts,
                      max(s.end - s.start for s in meta.seqs), max(s.context_len for s in meta.seqs))


def write_kv(kv: torch.Tensor, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> None:
    """Store new tokens' K and V ([T, kv_heads, head_dim]) into their slots of one layer."""
    planes = kv.shape[1] * kv.shape[2]
    kv[0].view(planes, *kv.shape[3:]).index_copy_(0, slots, k.to(kv.dtype))
    kv[1].view(planes, *kv.shape[3:]).index_copy_(0, slots, v.to(kv.dtype))


def _gather(plane: torch.Tensor, block_ids: torch.Tensor) -> torch.Tensor:
    """[n_blocks*block_size, kv_heads, head_dim] copy of the given blocks of one plane."""
    return plane.index_select(0, block_ids).flatten(0, 1)


def attend_exact(q: torch.Tensor, kv: torch.Tensor, meta: BatchMeta, chunk: int, rows: int = 0) -> torch.Tensor:
    """q [T, Hq, D] → [T, Hq, D] (fp32 math), batch-invariant; see the module doc.
    ``rows`` > 0 (GPUs): each request's queries go in tiles of exactly ``rows`` tokens (the
    last one padded with copies of its last query), so every matmul and reduction has the
    same shape whatever the step holds — a GPU picks its kernel, and so its reduction order,
    by shape."""
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    for s in meta.seqs:
        t = s.end - s.start
        step = rows if rows > 0 else t
        for lo in range(0, t, step):
            hi = min(t, lo + step)
            qs, pos = q[s.start + lo:s.start + hi], meta.positions[s.start + lo:s.start + hi]
            if rows > 0 and hi - lo < rows:
                fill = rows - (hi - lo)
                qs = torch.cat([qs, qs[-1:].expand(fill, -1, -1)])
                pos = torch.cat([pos, pos[-1:].expand(fill)])
            o = _attend_rows(qs, pos, kv, s, meta.block_size, chunk)
            out[s.start + lo:s.start + hi] = o[:hi - lo]
    return out


def _online_start(q: torch.Tensor, hkv: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The online softmax's start for queries q [t, Hq, D] over hkv KV heads: the scaled
    queries [hkv, g*t, D] and the running max, sum and output."""
    t, hq, d = q.shape
    g = hq // hkv
    qh = q.float().view(t, hkv, g, d).permute(1, 2, 0, 3).reshape(hkv, g * t, d) * (1.0 / math.sqrt(d))
    m = torch.full((hkv, g * t), float("-inf"), device=q.device)
    lsum = torch.zeros((hkv, g * t), device=q.device)
    acc = torch.zeros((hkv, g * t, d), device=q.device)
    return qh, m, lsum, acc


def _online_step(qh: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor, m: torch.Tensor,
                 lsum: torch.Tensor, acc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """One chunk of the online softmax: queries qh [hkv, g*t, D] against the chunk's keys and
    values [chunk, hkv, D], visible [g*t, chunk]; returns the running max, sum and output."""
    sc = torch.matmul(qh, k.permute(1, 2, 0))                     # [hkv, g*t, chunk]
    sc = sc.masked_fill(~visible, float("-inf"))
    m_new = torch.maximum(m, sc.amax(-1))
    alpha = torch.exp(m - m_new)
    p = torch.exp(sc - m_new[..., None])
    lsum = lsum * alpha + p.sum(-1)
    acc = acc * alpha[..., None] + torch.matmul(p, v.permute(1, 0, 2))
    return m_new, lsum, acc


def _attend_rows(q: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor, s: "SeqSpan", block_size: int,
                 chunk: int) -> torch.Tensor:
    """Queries q [t, Hq, D] of one request at positions pos, over its context: [t, Hq, D] fp32."""
    t, hq, d = q.shape
    hkv = kv.shape[3]
    g = hq // hkv
    bpc = chunk // block_size
    offs = torch.arange(chunk, device=q.device)
    qh, m, lsum, acc = _online_start(q, hkv)
    for c in range((s.context_len + chunk - 1) // chunk):
        ids = s.block_table[c * bpc:(c + 1) * bpc]
        k = _chunk_plane(kv[0], ids, chunk, s.context_len - c * chunk)
        v = _chunk_plane(kv[1], ids, chunk, s.context_len - c * chunk)
        visible = (c * chunk + offs)[None, :] <= pos[:, None]      # [t, chunk]
        m, lsum, acc = _online_step(qh, k, v, visible.repeat(g, 1), m, lsum, acc)
    o = acc / lsum[..., None]
    return o.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hq, d)


def _chunk_plane(plane: torch.Tensor, ids: torch.Tensor, chunk: int, valid: int) -> torch.Tensor:
    """One chunk of keys (or values) as fp32 [chunk, Hkv, D]; slots past `valid` are zero."""
    x = _gather(plane, ids).float()
    if x.shape[0] < chunk:
        x = torch.cat([x, x.new_zeros((chunk - x.shape[0],) + tuple(x.shape[1:]))])
    if valid < chunk:
        x[valid:] = 0.0
    return x


# --- fixed-shape decode attention (CUDA graphs: no host syncs, no shapes that follow the step) ---

def attend_exact_fixed(q: torch.Tensor, kv: torch.Tensor, positions: torch.Tensor, tables: torch.Tensor,
                       seq_lens: torch.Tensor, block_size: int, chunk: int, nchunks: int,
                       rows: int = 0) -> torch.Tensor:
    """attend_exact for decode rows (one query per row r, at positions[r], over seq_lens[r]
    context tokens through tables[r]) in shapes fixed by the row count and ``nchunks``, not by
    the contexts: every row runs ``nchunks`` chunks; those past its context see no key and are
    exact no-ops (scale 1, add 0), and keys past seq_lens are zeroed by a mask, as
    _chunk_plane zeroes them. Each matmul has attend_exact's shape, so the result is the same
    bits. tables [R, >= nchunks * chunk / block_size] int64 (padding entries: any valid block).
    Returns [R, Hq, D] fp32."""
    out = []
    for r in range(q.shape[0]):
        qs, pos = q[r:r + 1], positions[r:r + 1]
        if rows > 1:
            qs = torch.cat([qs, qs[-1:].expand(rows - 1, -1, -1)])
            pos = torch.cat([pos, pos[-1:].expand(rows - 1)])
        o = _attend_rows_fixed(qs, pos, kv, tables[r], seq_lens[r], block_size, chunk, nchunks)
        out.append(o[:1])
    return torch.cat(out)


def _attend_rows_fixed(q: torch.Tensor, pos: torch.Tensor, kv: torch.Tensor, table: torch.Tensor,
                       seq_len: torch.Tensor, block_size: int, chunk: int, nchunks: int) -> torch.Tensor:
    """_attend_rows with the chunk count and the valid length as data (see attend_exact_fixed)."""
    t, hq, d = q.shape
    hkv = kv.shape[3]
    g = hq // hkv
    bpc = chunk // block_size
    offs = torch.arange(chunk, device=q.device)
    qh, m, lsum, acc = _online_start(q, hkv)
    zero = torch.zeros((), device=q.device)
    for c in range(nchunks):
        ids = table[c * bpc:(c + 1) * bpc]
        keep = (c * chunk + offs) < seq_len
        k = torch.where(keep[:, None, None], _gather(kv[0], ids).float(), zero)
        v = torch.where(keep[:, None, None], _gather(kv[1], ids).float(), zero)
        visible = (c * chunk + offs)[None, :] <= pos[:, None]      # [t, chunk]
        m, lsum, acc = _online_step(qh, k, v, visible.repeat(g, 1), m, lsum, acc)
    o = acc / lsum[..., None]
    return o.view(hkv, g, t, d).permute(2, 0, 1, 3).reshape(t, hq, d)


@dataclasses.dataclass
class PackedDecode:
    """A decode step's contexts packed one after another into a fixed number of slots (the
    sdpa backend under CUDA graphs): row r's keys are ctx_slots[cu_k[r]:cu_k[r + 1]]; slots
    past cu_k[-1] are padding that no row reads."""

    ctx_slots: torch.Tensor  # [L] int64 pool slots (L: the step's bucket)
    cu_q: torch.Tensor       # [R+1] = 0..R (one query per row); int32 for the flash kernel
    cu_k: torch.Tensor       # [R+1]; int32 for the flash kernel
    max_k: int               # bound on one row's context (the bucket), for the flash kernel


def attend_packed(q: torch.Tensor, kv: torch.Tensor, pk: PackedDecode, flash: bool) -> torch.Tensor:
    """Decode queries q [R, Hq, D] over their packed contexts, shapes fixed by R and the
    bucket: one gather of L slots, then the varlen flash kernel (``flash``: cu_seqlens read on
    the device, max_seqlen_k = the bucket) or the same attention as dense masked math over all
    L keys (CPU, fp32, or where the flash op is missing). [R, Hq, D] in q's dtype."""
    hkv, d = kv.shape[3], kv.shape[4]
    ctx = kv.reshape(2, -1, hkv, d).index_select(1, pk.ctx_slots)  # [2, L, Hkv, D]
    if ctx.dtype != q.dtype:
        ctx = ctx.to(q.dtype)
    if flash:
        plan = VarlenPlan(pk.ctx_slots, pk.cu_q, pk.cu_k, [], 1, pk.max_k)
        return _flash_varlen(q, ctx[0], ctx[1], plan)
    return _attend_packed_math(q, ctx[0], ctx[1], pk.cu_k)


def _attend_packed_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_k: torch.Tensor) -> torch.Tensor:
    r, hq, d = q.shape
    L, hkv = k.shape[0], k.shape[1]
    g = hq // hkv
    qh = q.float().reshape(r, hkv, g, d).permute(1, 0, 2, 3).reshape(hkv, r * g, d)
    sc = torch.matmul(qh, k.float().permute(1, 2, 0)) * (1.0 / math.sqrt(d))   # [hkv, r*g, L]
    j = torch.arange(L, device=q.device)[None, :]
    cu = cu_k.long()
    mine = (j >= cu[:-1, None]) & (j < cu[1:, None])                            # [r, L]
    sc = sc.masked_fill(~mine[:, None, :].expand(r, g, L).reshape(r * g, L)[None], float("-inf"))
    o = torch.matmul(sc.softmax(-1), v.float().permute(1, 0, 2))                # [hkv, r*g, D]
    return o.view(hkv, r, g, d).permute(1, 0, 2, 3).reshape(r, hq, d).to(q.dtype)


def attend_sdpa(q: torch.Tensor, kv: torch.Tensor, meta: BatchMeta) -> torch.Tensor:
    """q [T, Hq, D] → [T, Hq, D] in q's dtype, one fused attention call per request."""
    out = torch.empty_like(q)
    hq, hkv = q.shape[1], kv.shape[3]
    with _fused_backends():
        for s in meta.seqs:
            t, L = s.end - s.start, s.context_len
            k = _gather(kv[0], s.block_table)[:L].transpose(0, 1)[None]   # [1, Hkv, L, D]
            v = _gather(kv[1], s.block_table)[:L].transpose(0, 1)[None]
            qq = q[s.start:s.end].transpose(0, 1)[None]                    # [1, Hq, t, D]
            o = _sdpa(qq, k.to(q.dtype), v.to(q.dtype), t, L, hq // hkv)
            out[s.start:s.end] = o[0].transpose(0, 1)
    return out


def _fused_backends():
    """Flash / memory-efficient kernels (math as the fallback), never cuDNN: cuDNN builds a
    graph per new shape, about 1 ms of CPU per call, and every decode step is a new shape."""
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
        return sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
    except (ImportError, TypeError, AttributeError):
        return contextlib.nullcontext()


_GQA_KWARG = {}  # {"gqa": bool}: does the installed torch take enable_gqa (>= 2.5)


def _sdpa(q, k, v, t: int, L: int, groups: int) -> torch.Tensor:
    fn = getattr(F, "scaled_dot_product_attention", None)
    masked = 1 < t < L  # queries at the end of a longer context: a bottom-right causal mask
    if fn is None:  # torch < 2.0: the same math, unfused
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        sc = torch.matmul(q.float(), k.float().transpose(-1, -2)) / math.sqrt(q.shape[-1])
        sc = sc.masked_fill(~_bottom_right_causal(t, L, q.device), float("-inf"))
        return torch.matmul(sc.softmax(-1), v.float()).to(q.dtype)
    kw = {}
    if groups > 1:
        if "gqa" not in _GQA_KWARG:
            _GQA_KWARG["gqa"] = _takes_enable_gqa(fn)
        if _GQA_KWARG["gqa"] and not masked:  # flash takes GQA; the masked kernel wants MHA
            kw["enable_gqa"] = True
        else:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
    if masked:
        return fn(q, k, v, attn_mask=_bottom_right_causal(t, L, q.device))
    return fn(q, k, v, is_causal=(t == L and t > 1), **kw)


def _takes_enable_gqa(fn) -> bool:
    x = torch.zeros((1, 2, 1, 8))
    try:
        fn(x, x[:, :1], x[:, :1], enable_gqa=True)
        return True
    except (TypeError, RuntimeError):
        return False


def _bottom_right_causal(t: int, L: int, device) -> torch.Tensor:
    """[t, L] bool: query i (absolute position L - t + i) sees keys 0..L - t + i."""
    qpos = torch.arange(L - t, L, device=device)[:, None]
    return torch.arange(L, device=device)[None, :] <= qpos


def attend(q: torch.Tensor, kv: torch.Tensor, meta: BatchMeta, backend: str, chunk: int, rows: int = 0) -> torch.Tensor:
    if backend == "exact":
        return attend_exact(q, kv, meta, chunk, rows).to(q.dtype)
    if meta.plan is not None:
        return attend_planned(q, kv, meta)
    return attend_sdpa(q, kv, meta)


def attend_planned(q: torch.Tensor, kv: torch.Tensor, meta: BatchMeta) -> torch.Tensor:
    """q [T, Hq, D] → [T, Hq, D] in q's dtype: one gather of the step's contexts (K and V
    together), then one varlen flash call for the whole batch (or one SDPA per request)."""
    plan = meta.plan
    hkv, d = kv.shape[3], kv.shape[4]
    ctx = kv.reshape(2, -1, hkv, d).index_select(1, plan.ctx_slots)  # [2, sum(L), Hkv, D]
    if ctx.dtype != q.dtype:
        ctx = ctx.to(q.dtype)
    if varlen_flash_usable(q, hkv):
        return _flash_varlen(q, ctx[0], ctx[1], plan)
    out = torch.empty_like(q)
    hq = q.shape[1]
    with _fused_backends():
        for s, k0 in zip(meta.seqs, plan.k_starts):
            t, L = s.end - s.start, s.context_len
            k = ctx[0, k0:k0 + L].transpose(0, 1)[None]   # [1, Hkv, L, D]
            v = ctx[1, k0:k0 + L].transpose(0, 1)[None]
            qq = q[s.start:s.end].transpose(0, 1)[None]    # [1, Hq, t, D]
            out[s.start:s.end] = _sdpa(qq, k, v, t, L, hq // hkv)[0].transpose(0, 1)
    return out


_VARLEN_CONTIGUOUS_Q = [False]  # set when the op wants a contiguous q (checked in _check_varlen)


def _flash_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: VarlenPlan) -> torch.Tensor:
    # (query, key, value, cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal,
    #  return_debug_mask) -> (output, logsumexp, ...); softmax scale defaults to 1/sqrt(D).
    if _VARLEN_CONTIGUOUS_Q[0]:
        q = q.contiguous()
    return torch.ops.aten._flash_attention_forward(q, k, v, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k,
                                                   0.0, True, False)[0]


_VARLEN_OK: Dict[Tuple, bool] = {}


def varlen_flash_usable(q: torch.Tensor, hkv: int) -> bool:
    """Whether the varlen flash op exists here and matches the math reference (checked once
    per device, dtype and head geometry, on a small problem with the step's layout)."""
    if q.device.type != "cuda" or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    if os.environ.get("ORBITKV_REFENGINE_VARLEN", "1") == "0":
        return False
    key = (str(q.device), q.dtype, q.shape[1], hkv, q.shape[2])
    ok = _VARLEN_OK.get(key)
    if ok is None:
        ok = _VARLEN_OK[key] = _check_varlen(q.device, q.dtype, q.shape[1], hkv, q.shape[2])
    return ok


def _check_varlen(device, dtype, hq: int, hkv: int, d: int) -> bool:
    fn = getattr(getattr(torch.ops, "aten", None), "_flash_attention_forward", None)
    if fn is None:
        return False
    g = torch.Generator(device=device)
    g.manual_seed(0)
    specs = [(5, 70), (1, 33), (16, 16), (1, 1)]  # (new queries, context): partial, decode, full
    T, Lsum = sum(t for t, _ in specs), sum(L for _, L in specs)
    # q as the fast forward makes it: a head slice of a wider [T, Hq + Hkv, D] tensor
    q = torch.randn((T, hq + hkv, d), generator=g, device=device, dtype=dtype)[:, :hq]
    kv = torch.randn((2, Lsum, hkv, d), generator=g, device=device, dtype=dtype)
    qs, ks = [0], [0]
    for t, L in specs:
        qs.append(qs[-1] + t)
        ks.append(ks[-1] + L)
    cu = torch.tensor(qs + ks, dtype=torch.int32, device=device)
    plan = VarlenPlan(torch.arange(Lsum, device=device), cu[:len(qs)], cu[len(qs):], ks,
                      max(t for t, _ in specs), max(L for _, L in specs))
    for contiguous in (False, True):
        _VARLEN_CONTIGUOUS_Q[0] = contiguous
        try:
            err = _varlen_error(q, kv, plan, specs, qs, ks, device, hq, hkv, d)
        except Exception as e:  # missing kernel, other signature, unsupported geometry
            err, why = float("inf"), f"{type(e).__name__}: {e}"
        else:
            why = f"max |err| {err:.3g} against the math reference"
        if err < 0.05:
            print(f"refengine: sdpa attention through varlen flash (Hq {hq}, Hkv {hkv}, D {d}, {dtype}, "
                  f"contiguous q {contiguous}; {why})", file=sys.stderr)
            return True
    print(f"refengine: varlen flash attention unusable ({why}); using per-request SDPA", file=sys.stderr)
    return False


def _varlen_error(q, kv, plan, specs, qs, ks, device, hq, hkv, d) -> float:
    got = _flash_varlen(q, kv[0], kv[1], plan).float()
    err = 0.0
    for i, (t, L) in enumerate(specs):
        qq = q[qs[i]:qs[i + 1]].float().transpose(0, 1)
        k = kv[0, ks[i]:ks[i + 1]].float().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        v = kv[1, ks[i]:ks[i + 1]].float().transpose(0, 1).repeat_interleave(hq // hkv, 0)
        sc = torch.matmul(qq, k.transpose(-1, -2)) / math.sqrt(d)
        sc = sc.masked_fill(~_bottom_right_causal(t, L, device), float("-inf"))
        want = torch.matmul(sc.softmax(-1), v).transpose(0, 1)
        err = max(err, (got[qs[i]:qs[i + 1]] - want).abs().max().item())
    return err

