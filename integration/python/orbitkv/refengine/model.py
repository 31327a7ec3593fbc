"""A Qwen3-architecture decoder in plain torch, with deterministic random weights.

Per layer: RMSNorm → fused q/k/v projection → per-head RMSNorm on q and k → RoPE (NeoX halves,
base `rope_theta`) → paged GQA attention → o projection → residual; RMSNorm → SwiGLU MLP →
residual. Final RMSNorm and an lm head (tied to the embedding or not). Weights are drawn from
N(0, 1/fan_in) (embedding N(0, 1)) with a generator seeded by `seed`, so activations keep unit
scale through the depth and greedy outputs depend on the context.

Two forwards compute the same function. `exact` attention runs the plain per-layer loop below
(the CPU reference, bit-identical across step shapes). `sdpa` runs `_forward_fast`: per layer
fewer, larger ops (fused RMSNorm where torch has one, q and k normed and rotated together, RoPE
as one roll + multiply-add, residual adds fused into the projections' GEMMs) and attention
through the step's `VarlenPlan` (one context gather and one varlen flash call per layer for
the whole batch; see attention.py).
"""

from __future__ import annotations

import dataclasses
from typing import List, Optional

import torch
import torch.nn.functional as F

from .attention import (BatchMeta, attend, attend_exact_fixed, attend_packed, attend_planned, plan_from_meta,
                        write_kv)
from .config import ModelConfig


class LayerHooks:
    """Called around each layer's attention (the KV connector's worker-side seam)."""

    def before_attention(self, layer: int) -> None:  # wait_for_layer_load
        pass

    def after_attention(self, layer: int, kv: torch.Tensor, meta: BatchMeta) -> None:  # save_kv_layer
        pass


@dataclasses.dataclass
class LayerWeights:
    in_norm: torch.Tensor
    wqkv: torch.Tensor
    q_norm: torch.Tensor
    k_norm: torch.Tensor
    wo: torch.Tensor
    post_norm: torch.Tensor
    wgu: torch.Tensor
    wdown: torch.Tensor


def fixed_rows(x: torch.Tensor, rows: int, fn) -> torch.Tensor:
    """fn(x) computed over row tiles of exactly `rows` rows (the last padded with zeros) when
    rows > 0: a GPU picks a GEMM's or a reduction's kernel, and so its order of summation, by
    the operands' shape, so tiles of one shape compute every token's row the same way whatever
    else shares the step (batch invariance; the CPU's kernels already are, rows = 0)."""
    n = x.shape[0]
    if rows <= 0 or n == 0:
        return fn(x)
    pad = (-n) % rows
    if pad:
        x = torch.cat([x, x.new_zeros((pad,) + tuple(x.shape[1:]))])
    return torch.cat([fn(x[i:i + rows]) for i in range(0, x.shape[0], rows)])[:n]


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * xf.to(x.dtype)


_F_RMS_NORM = getattr(F, "rms_norm", None)  # torch >= 2.4: one call (a fused kernel in newer torch)


def rms_norm_fast(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm as one torch call where available (same math: fp32 statistics, result in x's
    dtype, times weight); the plain ops otherwise."""
    if _F_RMS_NORM is not None and weight.shape == x.shape[-1:]:
        return _F_RMS_NORM(x, (x.shape[-1],), weight, eps)
    return rms_norm(x, weight, eps)


def rope_fast(x: torch.Tensor, cos2: torch.Tensor, sin2: torch.Tensor) -> torch.Tensor:
    """The same NeoX rotation as Qwen3Model.rope, in 3 ops: x*cos2 + roll(x, D/2)*sin2 with
    cos2 = [cos, cos] and sin2 = [-sin, sin] (fp32, broadcast over heads)."""
    xf = x.float()
    return torch.addcmul(xf * cos2, xf.roll(x.shape[-1] // 2, -1), sin2).to(x.dtype)


class Qwen3Model:
    """Weights plus a forward over a flat batch of new tokens of several requests."""

    def __init__(self, cfg: ModelConfig, device: str = "cpu", seed: int = 0):
        cfg.validate()
        self.cfg = cfg
        self.device = torch.device(device)
        self.dtype = cfg.torch_dtype
        gen = torch.Generator(device=self.device)
        gen.manual_seed(seed)
        h, d = cfg.hidden, cfg.head_dim
        q, kv = cfg.num_q_heads * d, cfg.num_kv_heads * d

        def rand(*shape, fan_in: Optional[int] = None):
            w = torch.randn(shape, generator=gen, device=self.device, dtype=self._init_dtype())
            if fan_in:
                w.mul_(fan_in ** -0.5)
            return w.to(self.dtype)

        def ones(n):
            return torch.ones(n, device=self.device, dtype=self.dtype)

        with torch.no_grad():
            self.embed = rand(cfg.vocab, h)
            self.layers: List[LayerWeights] = [
                LayerWeights(
                    in_norm=ones(h), wqkv=rand(q + 2 * kv, h, fan_in=h), q_norm=ones(d), k_norm=ones(d),
                    wo=rand(h, q, fan_in=q), post_norm=ones(h),
                    wgu=rand(2 * cfg.intermediate, h, fan_in=h),
                    wdown=rand(h, cfg.intermediate, fan_in=cfg.intermediate))
                for _ in range(cfg.num_layers)]
            self.final_norm = ones(h)
            self.lm_head = self.embed if cfg.tie_embeddings else rand(cfg.vocab, h, fan_in=h)
            self.cos, self.sin = self._rope_tables()

    def _init_dtype(self):
        # fp32 draws on CPU (a bf16 CPU randn is slow); native dtype on CUDA (no fp32 copy of 8B).
        return torch.float32 if self.device.type == "cpu" else self.dtype

    def _rope_tables(self):
        d = self.cfg.head_dim
        inv = 1.0 / (self.cfg.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=self.device) / d))
        ang = torch.arange(self.cfg.max_positions, dtype=torch.float32, device=self.device)[:, None] * inv[None, :]
        return ang.cos(), ang.sin()

    def rope_tables(self, positions: torch.Tensor):
        """(cos, sin) rows of `positions`, shaped to broadcast over [T, H, D/2]."""
        return (self.cos.index_select(0, positions)[:, None, :],
                self.sin.index_select(0, positions)[:, None, :])

    @staticmethod
    def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        """x [T, H, D]; NeoX-style rotation of the two halves, in fp32."""
        xf = x.float()
        x1, x2 = xf.chunk(2, dim=-1)
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)

    @torch.no_grad()
    def forward(self, tokens: torch.Tensor, meta: BatchMeta, kv_layers: List[torch.Tensor],
                attn_backend: str = "exact", attn_chunk: int = 256,
                hooks: Optional[LayerHooks] = None, rows: int = 0) -> torch.Tensor:
        """tokens [T] → fp32 logits [len(meta.logits_indices), vocab]; writes K/V into kv_layers.
        ``rows`` > 0 (exact backend): every GEMM, norm and attention runs on tiles of that many
        tokens (fixed_rows), for batch invariance on GPUs."""
        hooks = hooks or LayerHooks()
        if attn_backend != "exact":
            return self._forward_fast(tokens, meta, kv_layers, hooks)
        h = self._exact_stack(
            tokens, meta.positions, kv_layers, rows, hooks, meta,
            write=lambda kv, k, v: write_kv(kv, k, v, meta.slot_mapping),
            attn=lambda q, kv: attend(q, kv, meta, attn_backend, attn_chunk, rows))
        return self._exact_head(h.index_select(0, meta.logits_indices), rows)

    def _exact_stack(self, tokens, positions, kv_layers, rows: int, hooks: LayerHooks, meta, write, attn):
        """The exact forward's layers: hidden states [T, hidden] after the last layer.
        write(kv, k, v) stores the new tokens' K/V; attn(q, kv) → [T, Hq, D] in q's dtype."""
        c = self.cfg
        T, d = tokens.shape[0], c.head_dim
        q_sz, kv_sz = c.num_q_heads * d, c.num_kv_heads * d
        eps = c.rms_eps

        def lin(x, w):
            return fixed_rows(x, rows, lambda t: F.linear(t, w))

        def norm(x, w):
            return fixed_rows(x, rows, lambda t: rms_norm(t, w, eps))

        h = self.embed.index_select(0, tokens)
        cos, sin = self.rope_tables(positions)
        for i, w in enumerate(self.layers):
            q, k, v = lin(norm(h, w.in_norm), w.wqkv).split([q_sz, kv_sz, kv_sz], dim=-1)
            q = self.rope(norm(q.reshape(T, c.num_q_heads, d), w.q_norm), cos, sin)
            k = self.rope(norm(k.reshape(T, c.num_kv_heads, d), w.k_norm), cos, sin)
            v = v.reshape(T, c.num_kv_heads, d)
            hooks.before_attention(i)
            write(kv_layers[i], k, v)
            a = attn(q, kv_layers[i])
            hooks.after_attention(i, kv_layers[i], meta)
            h = h + lin(a.reshape(T, q_sz), w.wo)
            gate, up = lin(norm(h, w.post_norm), w.wgu).chunk(2, dim=-1)
            h = h + lin(F.silu(gate) * up, w.wdown)
        return h

    def _exact_head(self, h: torch.Tensor, rows: int) -> torch.Tensor:
        last = fixed_rows(h, rows, lambda t: rms_norm(t, self.final_norm, self.cfg.rms_eps))
        return fixed_rows(last, rows, lambda t: F.linear(t, self.lm_head)).float()

    @torch.no_grad()
    def forward_decode(self, d: "DecodeInputs", kv_layers: List[torch.Tensor], attn_backend: str,
                       attn_chunk: int = 256, rows: int = 0, flash: bool = False):
        """A decode step in fixed shapes (what a CUDA graph captures): one token per row, every
        row sampled, padding rows (copies of row 0) writing row 0's K/V into row 0's slot, no
        host sync. Returns (fp32 logits [R, vocab], greedy tokens [R] int64)."""
        def write(kv, k, v):
            write_kv(kv, k.index_select(0, d.src), v.index_select(0, d.src), d.slots)

        hooks = LayerHooks()
        if attn_backend == "exact":
            h = self._exact_stack(
                d.tokens, d.positions, kv_layers, rows, hooks, None, write=write,
                attn=lambda q, kv: attend_exact_fixed(q, kv, d.positions, d.tables, d.seq_lens, d.block_size,
                                                      attn_chunk, d.nchunks, rows).to(q.dtype))
            logits = self._exact_head(h, rows)
        else:
            # cu_seqlens as the flash kernel takes them, converted here (inside a capture: every
            # replay converts the buffer's current values)
            pk = dataclasses.replace(d.packed, cu_q=d.packed.cu_q.to(torch.int32), cu_k=d.packed.cu_k.to(torch.int32))
            h = self._fast_stack(d.tokens, d.positions, kv_layers, hooks, None, write=write,
                                 attn=lambda q, kv: attend_packed(q, kv, pk, flash))
            logits = self._fast_head(h)
        return logits, logits.argmax(-1)

    def _fast_tables(self):
        """cos2/sin2 RoPE tables and, per layer, whether q_norm == k_norm (then q and k are
        normed in one call); built on first use."""
        ft = getattr(self, "_fast", None)
        if ft is None:
            cos2 = torch.cat([self.cos, self.cos], -1)
            sin2 = torch.cat([-self.sin, self.sin], -1)
            same = [bool(torch.equal(w.q_norm, w.k_norm)) for w in self.layers]
            ft = self._fast = (cos2, sin2, same)
        return ft

    def _forward_fast(self, tokens: torch.Tensor, meta: BatchMeta, kv_layers: List[torch.Tensor],
                      hooks: LayerHooks) -> torch.Tensor:
        if meta.plan is None:
            meta.plan = plan_from_meta(meta)
        slots = meta.slot_mapping
        c = self.cfg

        def write(kv, k, v):
            flat = kv.view(2, -1, c.num_kv_heads, c.head_dim)
            flat[0].index_copy_(0, slots, k.to(kv.dtype))
            flat[1].index_copy_(0, slots, v.to(kv.dtype))

        h = self._fast_stack(tokens, meta.positions, kv_layers, hooks, meta, write=write,
                             attn=lambda q, kv: attend_planned(q, kv, meta))
        return self._fast_head(h.index_select(0, meta.logits_indices))

    def _fast_stack(self, tokens, positions, kv_layers, hooks: LayerHooks, meta, write, attn):
        c = self.cfg
        T, d, hq, hkv = tokens.shape[0], c.head_dim, c.num_q_heads, c.num_kv_heads
        qk_sz = (hq + hkv) * d
        eps = c.rms_eps
        cos2, sin2, same = self._fast_tables()
        cos2 = cos2.index_select(0, positions)[:, None, :]
        sin2 = sin2.index_select(0, positions)[:, None, :]
        h = self.embed.index_select(0, tokens)
        for i, w in enumerate(self.layers):
            qkv = F.linear(rms_norm_fast(h, w.in_norm, eps), w.wqkv)
            v = qkv[:, qk_sz:].view(T, hkv, d)
            if same[i]:
                qk = rope_fast(rms_norm_fast(qkv[:, :qk_sz].view(T, hq + hkv, d), w.q_norm, eps), cos2, sin2)
                q, k = qk[:, :hq], qk[:, hq:]
            else:
                q = rope_fast(rms_norm_fast(qkv[:, :hq * d].view(T, hq, d), w.q_norm, eps), cos2, sin2)
                k = rope_fast(rms_norm_fast(qkv[:, hq * d:qk_sz].view(T, hkv, d), w.k_norm, eps), cos2, sin2)
            kv = kv_layers[i]
            hooks.before_attention(i)
            write(kv, k, v)
            a = attn(q, kv)
            hooks.after_attention(i, kv, meta)
            h = torch.addmm(h, a.reshape(T, hq * d), w.wo.t())
            gate, up = F.linear(rms_norm_fast(h, w.post_norm, eps), w.wgu).chunk(2, dim=-1)
            h = torch.addmm(h, F.silu(gate).mul_(up), w.wdown.t())
        return h

    def _fast_head(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(rms_norm_fast(h, self.final_norm, self.cfg.rms_eps), self.lm_head).float()
