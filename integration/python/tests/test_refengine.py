"""Reference engine core: model, paged attention, prefix cache, eviction, batching."""

import math
import os
import random

import pytest
import torch
import torch.nn.functional as F

from orbitkv.refengine import PRESETS, engine_config, preset
from orbitkv.refengine.attention import BatchMeta, SeqSpan, attend_exact, attend_sdpa, write_kv
from orbitkv.refengine.blocks import BlockPool, hash_block
from orbitkv.refengine.config import with_model
from orbitkv.refengine.engine import Engine
from orbitkv.refengine.model import Qwen3Model

V = PRESETS["tiny"].vocab


def rows_are_independent_of_row_count() -> bool:
    """The precondition of bit-identical restore on CPU: a row of x @ W^T does not change
    with how many rows are multiplied together. True for Debian's torch (generic BLAS, the
    CI platform); false for MKL builds, which pick other kernels for other row counts."""
    g = torch.Generator().manual_seed(0)
    for k, n in [(64, 192), (64, 64), (128, 64), (64, 512), (16, 256)]:
        w, x = torch.randn((n, k), generator=g), torch.randn((97, k), generator=g)
        full = F.linear(x, w)
        for m in (1, 2, 5, 33):
            if not torch.equal(F.linear(x[-m:], w), full[-m:]):
                return False
    return True


ROW_INVARIANT = rows_are_independent_of_row_count()
# Tests that compare outputs of differently shaped steps bit for bit.
bit_exact = pytest.mark.skipif(
    not ROW_INVARIANT and os.environ.get("ORBITKV_REQUIRE") != "bit-exact",
    reason="this platform's CPU matmul changes a row's result with the row count (MKL); "
           "bit-identical restore needs a row-invariant BLAS (Debian's torch 1.13 has one)")


def tiny(**kw):
    kw.setdefault("kv_tokens", 2048)
    kw.setdefault("block_size", 4)
    kw.setdefault("page_tokens", 16)
    return engine_config("tiny", **kw)


def prompts(n, length, seed=0, shared=0):
    """n prompts of `length` tokens; the first `shared` tokens are common to all."""
    rng = random.Random(seed)
    head = [rng.randrange(V) for _ in range(shared)]
    return [head + [rng.randrange(V) for _ in range(length - shared)] for _ in range(n)]


def serial(cfg, ps, max_tokens):
    """Each prompt alone on a fresh engine: the reference output."""
    out = []
    for p in ps:
        with Engine(cfg) as e:
            out.append(e.generate([p], max_tokens)[0])
    return out


# --- configuration ---------------------------------------------------------------------------

def test_qwen3_8b_preset_is_the_real_geometry_without_allocating():
    c = preset("qwen3-8b")
    c.validate()
    assert (c.num_layers, c.hidden, c.num_q_heads, c.num_kv_heads, c.head_dim) == (36, 4096, 32, 8, 128)
    assert (c.intermediate, c.vocab, c.dtype, c.tie_embeddings) == (12288, 151936, "bf16", False)
    assert c.kv_bytes_per_token() == 36 * 2 * 8 * 128 * 2
    assert 8.0e9 < c.num_params() < 8.4e9  # Qwen3-8B has 8.19 B parameters


def test_config_validation():
    with pytest.raises(ValueError, match="multiple of block_size"):
        engine_config("tiny", block_size=16, page_tokens=24)
    with pytest.raises(ValueError, match="unknown preset"):
        engine_config("nope")
    with pytest.raises(ValueError, match="less than one block"):
        engine_config("tiny", kv_tokens=2, block_size=4, page_tokens=4)


def test_pool_is_one_shared_file_in_flash_layout():
    cfg = tiny(kv_tokens=64)
    with Engine(cfg) as e:
        pool = e.pool
        assert pool.shm_path.startswith("/dev/shm/orbitkv-refengine-%d-" % os.getpid())
        assert os.path.getsize(pool.shm_path) == pool.nbytes
        assert oct(os.stat(pool.shm_path).st_mode & 0o777) == "0o600"
        kv = pool.kv_caches()
        assert list(kv) == [f"model.layers.{i}.self_attn.attn" for i in range(2)]
        t = kv["model.layers.1.self_attn.attn"]
        assert tuple(t.shape) == (2, 16, 4, 2, 16) and t.dtype == torch.float32
        assert t[1].data_ptr() - pool.buffer.data_ptr() == pool.segment_offset(1, 1)
        t[1, 3].fill_(7.0)  # the bytes are the file's bytes
        raw = torch.from_file(pool.shm_path, shared=True, size=pool.nbytes, dtype=torch.uint8)
        assert raw.view(torch.float32).sum().item() == 7.0 * 4 * 2 * 16
        path = pool.shm_path
    assert not os.path.exists(path)


# --- model ---------------------------------------------------------------------------------

def test_model_is_deterministic_per_seed_and_finite():
    c = preset("tiny")
    a, b, other = Qwen3Model(c, seed=0), Qwen3Model(c, seed=0), Qwen3Model(c, seed=1)
    assert torch.equal(a.layers[1].wqkv, b.layers[1].wqkv) and torch.equal(a.lm_head, b.lm_head)
    assert not torch.equal(a.layers[1].wqkv, other.layers[1].wqkv)
    d = c.head_dim
    assert tuple(a.layers[0].wqkv.shape) == ((c.num_q_heads + 2 * c.num_kv_heads) * d, c.hidden)
    assert tuple(a.layers[0].wgu.shape) == (2 * c.intermediate, c.hidden)
    assert tuple(a.lm_head.shape) == (c.vocab, c.hidden)
    tied = Qwen3Model(with_model(tiny(), tie_embeddings=True).model)
    assert tied.lm_head is tied.embed


def test_rope_is_the_neox_rotate_half_form():
    m = Qwen3Model(preset("tiny"))
    x = torch.randn(5, 3, 16)
    pos = torch.tensor([0, 1, 7, 100, 4000])
    inv = 1.0 / (10_000.0 ** (torch.arange(0, 16, 2).float() / 16))
    ang = pos[:, None].float() * inv[None, :]
    cos, sin = torch.cat([ang.cos()] * 2, -1)[:, None], torch.cat([ang.sin()] * 2, -1)[:, None]
    rotate_half = torch.cat([-x[..., 8:], x[..., :8]], -1)
    want = x * cos + rotate_half * sin  # Hugging Face's apply_rotary_pos_emb
    assert torch.allclose(m.rope(x, *m.rope_tables(pos)), want, atol=1e-5)
    assert torch.equal(m.rope(x, *m.rope_tables(torch.zeros(5, dtype=torch.long))), x)


def _dense_forward(model, tokens):
    """The same decoder over contiguous K/V (no pages), causal SDPA math: the reference."""
    c = model.cfg
    T, d = len(tokens), c.head_dim
    cos, sin = model.rope_tables(torch.arange(T))
    h = model.embed[torch.tensor(tokens)]
    from orbitkv.refengine.model import rms_norm
    for w in model.layers:
        x = rms_norm(h, w.in_norm, c.rms_eps)
        q, k, v = F.linear(x, w.wqkv).split([c.num_q_heads * d, c.num_kv_heads * d, c.num_kv_heads * d], -1)
        q = model.rope(rms_norm(q.reshape(T, -1, d), w.q_norm, c.rms_eps), cos, sin)
        k = model.rope(rms_norm(k.reshape(T, -1, d), w.k_norm, c.rms_eps), cos, sin)
        v = v.reshape(T, -1, d)
        g = c.num_q_heads // c.num_kv_heads
        k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
        s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(d)
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
        a = torch.einsum("hqk,khd->qhd", s.softmax(-1), v).reshape(T, -1)
        h = h + F.linear(a, w.wo)
        gate, up = F.linear(rms_norm(h, w.post_norm, c.rms_eps), w.wgu).chunk(2, -1)
        h = h + F.linear(F.silu(gate) * up, w.wdown)
    return F.linear(rms_norm(h[-1:], model.final_norm, c.rms_eps), model.lm_head)


def test_engine_logits_match_a_dense_reference_model():
    cfg = tiny(kv_tokens=512)
    toks = prompts(1, 77, seed=3)[0]
    with Engine(cfg) as e:
        so = e.scheduler.schedule()
        assert not so.seqs
        e.add_request(toks, 1)
        so = e.scheduler.schedule()
        batch = e.runner._build(so)
        got = e.model.forward(batch[0], batch[1], e.pool.layers, "exact", cfg.attn_chunk_tokens)
        want = _dense_forward(e.model, toks)
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
    assert got.std() > 0.5  # not degenerate


def test_outputs_are_not_degenerate():
    with Engine(tiny()) as e:
        outs = e.generate(prompts(4, 40, seed=5), 16)
    assert len({tuple(o) for o in outs}) == 4
    assert all(len(set(o)) > 4 for o in outs)


# --- paged attention -------------------------------------------------------------------------

def _paged_case(seed=0, B=4, Hq=4, Hkv=2, D=16, nblocks=64):
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn((2, nblocks, B, Hkv, D), generator=g)
    perm = torch.randperm(nblocks, generator=g)
    # three sequences: (context, new tokens) — a prefill, a prefill over a prefix, a decode
    specs = [(37, 37), (50, 13), (29, 1)]
    seqs, qs, pos, slots, dense = [], [], [], [], []
    off, used = 0, 0
    for L, t in specs:
        nb = -(-L // B)
        table = perm[used:used + nb]
        used += nb
        k = torch.randn((L, Hkv, D), generator=g)
        v = torch.randn((L, Hkv, D), generator=g)
        p = torch.arange(L)
        s = table[p // B] * B + p % B
        write_kv(kv, k, v, s)  # the whole context goes through the slots
        q = torch.randn((t, Hq, D), generator=g)
        seqs.append(SeqSpan(off, off + t, L, table))
        qs.append(q)
        pos.append(torch.arange(L - t, L))
        slots.append(s[L - t:])
        dense.append((q, k, v, L - t))
        off += t
    meta = BatchMeta(torch.cat(slots), torch.cat(pos), seqs, B, torch.tensor([off - 1]))
    return torch.cat(qs), kv, meta, dense


def _dense_attention(q, k, v, start):
    t, Hq, D = q.shape
    g = Hq // k.shape[1]
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    s = torch.einsum("qhd,khd->hqk", q, k) / math.sqrt(D)
    mask = torch.arange(k.shape[0])[None, :] <= (start + torch.arange(t))[:, None]
    s = s.masked_fill(~mask, float("-inf"))
    return torch.einsum("hqk,khd->qhd", s.softmax(-1), v)


@pytest.mark.parametrize("chunk", [16, 32, 256])
def test_paged_attention_equals_dense_reference(chunk):
    q, kv, meta, dense = _paged_case()
    want = torch.cat([_dense_attention(*d) for d in dense])
    got = attend_exact(q, kv, meta, chunk)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()
    got2 = attend_sdpa(q, kv, meta)
    assert torch.allclose(got2, want, atol=1e-5, rtol=1e-5), (got2 - want).abs().max()


@bit_exact
def test_exact_attention_is_batch_invariant():
    """A query's output does not depend on the other queries of its step (bit for bit)."""
    q, kv, meta, _ = _paged_case(seed=1)
    full = attend_exact(q, kv, meta, 16)
    s = meta.seqs[0]  # the 37-token prefill: recompute its last 5 queries alone
    t0 = s.end - 5
    sub = BatchMeta(meta.slot_mapping[t0:s.end], meta.positions[t0:s.end],
                    [SeqSpan(0, 5, s.context_len, s.block_table)], 4, torch.tensor([4]))
    assert torch.equal(attend_exact(q[t0:s.end], kv, sub, 16), full[t0:s.end])


@bit_exact
def test_platform_matmul_rows_are_independent_of_row_count():
    assert rows_are_independent_of_row_count()


# --- prefix cache, eviction, batching ---------------------------------------------------------

def test_block_pool_lru_eviction_and_refcounts():
    bp = BlockPool(4)
    a = bp.allocate(2)
    h0, h1 = hash_block(None, [1, 2]), hash_block(hash_block(None, [1, 2]), [3, 4])
    bp.cache(a[0], h0)
    bp.cache(a[1], h1)
    bp.release(list(reversed(a)))  # tail first: the tail is evicted first
    assert bp.cached_prefix([h0, h1]) == a and bp.num_free() == 4
    bp.touch(a[:1])
    assert bp.num_free() == 3 and bp.num_free_after_touch(a) == 2
    got = bp.allocate(3)  # two never-cached blocks, then the tail block (evicts h1)
    assert a[1] in got and bp.cached_prefix([h0, h1]) == a[:1] and bp.evictions == 1
    assert bp.allocate(1) is None
    with pytest.raises(RuntimeError):
        bp.release([a[1]] * 2)


@bit_exact
@pytest.mark.parametrize("rows", [0, 8], ids=["rows0", "tiles8"])
def test_prefix_cache_hit_gives_identical_output(rows):
    """rows=8: the GPU batch-invariant mode's token tiles (model.fixed_rows), run on the CPU."""
    cfg = tiny(invariant_rows=rows)
    ps = prompts(3, 90, seed=7, shared=60)
    want = serial(cfg, ps, 12)
    with Engine(cfg) as e:
        first = e.generate(ps[:1], 12)
        assert first == want[:1]
        again = e.generate(ps, 12)  # ps[0] fully cached, ps[1:] share 60 tokens
        st = e.stats()
    assert again == want
    assert st["prefix_hit_tokens"] >= 88 + 2 * 60
    assert st["kv_blocks_free"] == st["kv_blocks_total"]
    # Step accounting: every prompt token is either computed or a prefix hit (the first
    # generate computed all 90; the second only what the cache did not hold).
    assert st["computed_prompt_tokens"] == 4 * 90 - st["prefix_hit_tokens"]
    assert st["prefill_steps"] >= 2 and st["decode_steps"] >= 11
    assert st["prefill_step_seconds"] > 0 and st["decode_step_seconds"] > 0


@bit_exact
@pytest.mark.parametrize("rows", [0, 8], ids=["rows0", "tiles8"])
def test_small_pool_evicts_and_preempts_but_outputs_stay_identical(rows):
    ps = prompts(6, 70, seed=11, shared=32)
    want = serial(tiny(invariant_rows=rows), ps, 20)
    # 160 tokens: room for about two requests at a time; the rest wait or get preempted
    cfg = tiny(kv_tokens=160, max_batched_tokens=64, invariant_rows=rows)
    with Engine(cfg) as e:
        got = e.generate(ps, 20)
        st = e.stats()
    assert got == want
    assert st["prefix_cache_evictions"] > 0
    assert st["preemptions"] > 0
    assert st["kv_blocks_free"] == st["kv_blocks_total"]


def test_cached_tokens_are_set_once_at_first_admission():
    """A preempted request finds its own blocks in the prefix cache when it is admitted
    again; those are not cached tokens of the request (vLLM sets num_cached_tokens once),
    so distinct prompts submitted together report 0 cached tokens however often they were
    preempted."""
    ps = prompts(6, 70, seed=11)
    cfg = tiny(kv_tokens=160, max_batched_tokens=64)
    with Engine(cfg) as e:
        reqs = [e.add_request(p, 20) for p in ps]
        while e.has_work():
            e.step()
        st = e.stats()
    assert st["preemptions"] > 0
    preempted = [r for r in reqs if r.num_preemptions]
    assert preempted
    assert [r.num_cached_tokens for r in reqs] == [0] * len(reqs)


@bit_exact
def test_fixed_rows_tiles_compute_the_same_rows():
    """The GPU batch-invariant mode's tiles compute what one call computes (on a row-invariant
    BLAS, bit for bit), padding included, and tiles of 8 rows give a row the same result
    whatever surrounds it."""
    from orbitkv.refengine.model import fixed_rows, rms_norm

    g = torch.Generator().manual_seed(3)
    x, w = torch.randn((37, 64), generator=g), torch.randn((96, 64), generator=g)
    assert torch.equal(fixed_rows(x, 8, lambda t: F.linear(t, w)), F.linear(x, w))
    assert torch.equal(fixed_rows(x, 8, lambda t: rms_norm(t, torch.ones(64), 1e-6)), rms_norm(x, torch.ones(64), 1e-6))
    alone = fixed_rows(x[5:6], 8, lambda t: F.linear(t, w))
    assert torch.equal(alone, fixed_rows(x, 8, lambda t: F.linear(t, w))[5:6])
    assert fixed_rows(x, 0, lambda t: t * 2).shape == x.shape


def test_invariant_rows_default_to_tiles_on_cuda_exact_only():
    assert tiny().resolved_invariant_rows == 0
    assert tiny(device="cuda", attn_backend="exact").resolved_invariant_rows == 64
    assert tiny(device="cuda").resolved_invariant_rows == 0  # sdpa: the fast, non-invariant mode
    assert tiny(device="cuda", attn_backend="exact", invariant_rows=16).resolved_invariant_rows == 16


def test_too_long_request_is_rejected():
    with Engine(tiny(kv_tokens=64)) as e:
        with pytest.raises(ValueError, match="exceed the KV pool"):
            e.add_request(list(range(60)), 8)
        with pytest.raises(ValueError, match="token ids"):
            e.add_request([V], 1)


@bit_exact
def test_continuous_batching_matches_serial_outputs():
    rng = random.Random(13)
    ps = [prompts(1, rng.randrange(5, 120), seed=100 + i)[0] for i in range(8)]
    want = serial(tiny(), ps, 10)
    cfg = tiny(max_batched_tokens=48, max_num_seqs=5)  # chunked prefill mixed with decodes
    with Engine(cfg) as e:
        reqs = [e.add_request(p, 10) for p in ps[:4]]
        steps, batched = 0, 0
        while e.has_work():
            e.step()
            steps += 1
            batched = max(batched, len(e.scheduler.running))
            if steps == 3:  # late arrivals join a running batch
                reqs += [e.add_request(p, 10) for p in ps[4:]]
        assert [r.output_token_ids for r in reqs] == want
        assert batched >= 4


# --- the sdpa (GPU) forward, checked on CPU against exact ------------------------------------

def test_planned_attention_equals_dense_reference():
    """attend_planned (one context gather per layer, per-request SDPA or math on CPU) ==
    the dense reference, with the plan from the spans or handed in."""
    from orbitkv.refengine.attention import attend_planned, plan_from_meta
    q, kv, meta, dense = _paged_case(seed=2)
    want = torch.cat([_dense_attention(*d) for d in dense])
    meta.plan = plan_from_meta(meta)
    assert meta.plan.k_starts == [0, 37, 87, 116] and meta.plan.max_q == 37 and meta.plan.max_k == 50
    assert meta.plan.cu_q.tolist() == [0, 37, 50, 51] and meta.plan.cu_k.tolist() == [0, 37, 87, 116]
    got = attend_planned(q, kv, meta)
    assert torch.allclose(got, want, atol=1e-5, rtol=1e-5), (got - want).abs().max()


def test_fast_forward_matches_exact_logits():
    """The sdpa forward (fused norms, joint q/k RoPE, addmm residuals, planned attention) ==
    the exact forward up to fp32 rounding: a prefill over a cached prefix and a batched decode."""
    cfg = tiny(kv_tokens=512)
    ps = prompts(3, 45, seed=11, shared=24)
    with Engine(cfg) as e:
        e.generate(ps[:1], 1)                       # ps[0]'s blocks enter the prefix cache
        for p in ps[1:]:
            e.add_request(p, 3)
        checked = 0
        while e.has_work():
            so = e.scheduler.schedule()
            if so.seqs:
                tok, meta, _ = e.runner._build(so)
                assert meta.plan is None            # exact backend: no plan
                snap = e.pool.buffer.clone()
                want = e.model.forward(tok, meta, e.pool.layers, "exact", cfg.attn_chunk_tokens)
                e.pool.buffer.copy_(snap)
                got = e.model.forward(tok, meta, e.pool.layers, "sdpa", cfg.attn_chunk_tokens)
                assert meta.plan is not None
                assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
                checked += 1
            e.scheduler.update_from_output(so, *e.runner.execute(so))
        assert checked >= 3


def test_sdpa_engine_generates_like_exact():
    """Whole engine on the sdpa backend (the worker builds the step's plan): same tokens as
    the exact backend for chunked prefill, prefix hits and batched decode."""
    ps = prompts(4, 40, seed=12, shared=16)
    with Engine(tiny(max_batched_tokens=24)) as e:
        want = e.generate(ps, 6)
    with Engine(tiny(max_batched_tokens=24, attn_backend="sdpa")) as e:
        got = e.generate(ps, 6)
    assert got == want
