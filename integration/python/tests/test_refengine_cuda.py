"""The reference engine's GPU path (sdpa backend): skips without CUDA.

Run on a GPU machine with ORBITKV_REQUIRE=cuda so nothing skips silently."""

import dataclasses
import os

import pytest
import torch

from orbitkv.refengine import engine_config
from orbitkv.refengine.attention import (BatchMeta, SeqSpan, attend_exact, attend_planned, plan_from_meta,
                                         varlen_flash_usable, write_kv)
from orbitkv.refengine.config import with_model
from orbitkv.refengine.engine import Engine

CUDA = torch.cuda.is_available()
pytestmark = pytest.mark.skipif(not CUDA and os.environ.get("ORBITKV_REQUIRE") != "cuda", reason="no CUDA device")


def _case(Hq=32, Hkv=8, D=128, B=16, specs=((8192, 64), (300, 1), (97, 97), (4000, 1))):
    g = torch.Generator().manual_seed(0)
    nblocks = sum(-(-L // B) for L, _ in specs) + 7
    kv = torch.zeros((2, nblocks, B, Hkv, D))
    perm = torch.randperm(nblocks, generator=g)
    seqs, qs, pos, slots, used, off = [], [], [], [], 0, 0
    for L, t in specs:
        nb = -(-L // B)
        table = perm[used:used + nb]
        used += nb
        p = torch.arange(L)
        write_kv(kv, torch.randn((L, Hkv, D), generator=g), torch.randn((L, Hkv, D), generator=g), table[p // B] * B + p % B)
        qs.append(torch.randn((t, Hq, D), generator=g))
        pos.append(torch.arange(L - t, L))
        slots.append((table[p // B] * B + p % B)[L - t:])
        seqs.append(SeqSpan(off, off + t, L, table.cuda()))
        off += t
    meta = BatchMeta(torch.cat(slots).cuda(), torch.cat(pos).cuda(), seqs, B, torch.tensor([off - 1]).cuda())
    return torch.cat(qs).cuda(), kv.cuda(), meta


def test_varlen_flash_matches_exact_bf16():
    q, kv, meta = _case()
    want = attend_exact(q, kv, meta, 256)  # fp32 math
    qb, kvb = q.bfloat16(), kv.bfloat16()
    assert varlen_flash_usable(qb, kv.shape[3]), "varlen flash attention unavailable on this GPU/torch"
    meta.plan = plan_from_meta(meta)
    got = attend_planned(qb, kvb, meta).float()
    err = (got - want).abs().max().item()
    assert err < 0.03, err
    os.environ["ORBITKV_REFENGINE_VARLEN"] = "0"  # the per-request fallback agrees too
    try:
        got2 = attend_planned(qb, kvb, meta).float()
    finally:
        del os.environ["ORBITKV_REFENGINE_VARLEN"]
    assert (got2 - want).abs().max().item() < 0.03


def test_fast_forward_close_to_exact_on_cuda():
    """Tiny geometry with 128-wide heads in bf16 on CUDA: sdpa-backend logits ≈ exact-backend
    logits (bf16 rounding apart), prefill over a cached prefix and batched decode."""
    cfg = with_model(engine_config("tiny", kv_tokens=1024, block_size=16, page_tokens=16, device="cuda"),
                     dtype="bf16", head_dim=128, num_q_heads=8, num_kv_heads=2, hidden=256, intermediate=512)
    import random
    rng = random.Random(0)
    head = [rng.randrange(512) for _ in range(100)]
    ps = [head + [rng.randrange(512) for _ in range(60)] for _ in range(3)]
    with Engine(cfg) as e:
        e.generate(ps[:1], 1)
        for p in ps[1:]:
            e.add_request(p, 3)
        checked = 0
        while e.has_work():
            so = e.scheduler.schedule()
            if so.seqs:
                tok, meta, _ = e.runner._build(so)
                snap = e.pool.buffer.clone()
                want = e.model.forward(tok, meta, e.pool.layers, "exact", cfg.attn_chunk_tokens)
                e.pool.buffer.copy_(snap)
                got = e.model.forward(tok, meta, e.pool.layers, "sdpa", cfg.attn_chunk_tokens)
                cos = torch.nn.functional.cosine_similarity(got, want, dim=-1).min().item()
                assert cos > 0.99, cos
                checked += 1
            e.scheduler.update_from_output(so, *e.runner.execute(so))
        assert checked >= 3


def test_exact_mode_with_token_tiles_is_batch_invariant_on_cuda():
    """The batch-invariant GPU mode (exact backend, 64-token tiles, bf16): a prompt's greedy
    output alone, in a batch with others, after a cached prefix and through chunked prefill
    is the same token for token; and its logits are bit-identical alone and batched."""
    from orbitkv.refengine.model import fixed_rows  # noqa: F401  (the mode under test)

    cfg = engine_config("tiny", device="cuda", attn_backend="exact", kv_tokens=4096, block_size=16,
                        page_tokens=64, max_batched_tokens=96)
    assert cfg.resolved_invariant_rows == 64
    import random
    rng = random.Random(5)
    head = [rng.randrange(cfg.model.vocab) for _ in range(150)]
    ps = [head + [rng.randrange(cfg.model.vocab) for _ in range(30 + 7 * i)] for i in range(4)]
    want = []
    for p in ps:
        with Engine(cfg) as e:
            want.append(e.generate([p], 10)[0])
    with Engine(cfg) as e:
        assert e.generate(ps[:1], 10) == want[:1]
        assert e.generate(ps, 10) == want  # ps[0] cached, the rest share 150 tokens, chunked by 96


# --- decode steps as CUDA graph replays (graphs.py) ------------------------------------------

def _staggered(e, n, seed):
    """n requests whose lengths differ, so the decode batch shrinks n → 1 (padded 8/4/2/1)."""
    import random
    rng = random.Random(seed)
    return [e.add_request([rng.randrange(e.cfg.model.vocab) for _ in range(20 + 9 * i)], 4 + 2 * i)
            for i in range(n)]


def _run(cfg, n, seed=0):
    with Engine(cfg) as e:
        reqs = _staggered(e, n, seed)
        while e.has_work():
            e.step()
        return [r.output_token_ids for r in reqs], e.runner.graphs


@pytest.mark.parametrize("n", [3, 8])
def test_graph_decode_tokens_equal_eager_tokens(n):
    """sdpa backend (tiny, fp32 on CUDA): the same tokens with decode graphs as without, every
    decode step a replay after its key's first capture."""
    cfg = engine_config("tiny", device="cuda", kv_tokens=4096, block_size=16, page_tokens=64)
    want, off = _run(dataclasses.replace(cfg, cuda_graphs="off"), n)
    assert off is None
    got, g = _run(dataclasses.replace(cfg, cuda_graphs="on"), n)
    assert g.disabled is None, g.disabled
    assert g.stats["captures"] >= 1 and g.stats["replays"] >= 3, g.stats  # n=3: 3 keys (4, 2, 1 rows), 7 steps
    assert got == want


@pytest.mark.parametrize("n", [3, 8])
def test_graph_decode_exact_mode_stays_batch_invariant(n):
    """exact backend (64-token tiles) with decode graphs on: each prompt alone and all n
    together give the eager engine's tokens; a replay that differed from the eager step in
    one bit would have turned graphs off (then this fails, and exact mode keeps eager steps)."""
    cfg = engine_config("tiny", device="cuda", attn_backend="exact", kv_tokens=4096, block_size=16,
                        page_tokens=64, cuda_graphs="on")
    want, _ = _run(dataclasses.replace(cfg, cuda_graphs="off"), n)
    got, g = _run(cfg, n)
    assert g.disabled is None, g.disabled
    assert g.stats["replays"] >= 3, g.stats
    assert got == want
    import random
    rng = random.Random(0)  # _staggered's prompts, each alone on a fresh engine (batch-1 graphs)
    ps = [([rng.randrange(cfg.model.vocab) for _ in range(20 + 9 * i)], 4 + 2 * i) for i in range(n)]
    alone = []
    for p, m in ps:
        with Engine(cfg) as e:
            alone.append(e.generate([p], m)[0])
    assert alone == want


def test_graph_decode_bf16_flash_close_to_eager():
    """bf16 with 128-wide heads (the varlen flash kernel inside the graph): each decode step's
    logits ≈ the eager sdpa step's on a copy of the pool."""
    cfg = with_model(engine_config("tiny", kv_tokens=2048, block_size=16, page_tokens=16, device="cuda",
                                   cuda_graphs="on"),
                     dtype="bf16", head_dim=128, num_q_heads=8, num_kv_heads=2, hidden=256, intermediate=512)
    with Engine(cfg) as e:
        _staggered(e, 8, 1)
        checked = 0
        while e.has_work():
            so = e.scheduler.schedule()
            graph = e.runner._graph_step(so)
            if graph is not None:
                tok, meta, _ = e.runner._build(so)
                snap = e.pool.buffer.clone()
                want = e.model.forward(tok, meta, e.pool.layers, "sdpa", cfg.attn_chunk_tokens)
                e.pool.buffer.copy_(snap)
            sampled, kvo = e.runner.execute(so)
            if graph is not None:
                got = e.runner.graphs.last_logits
                cos = torch.nn.functional.cosine_similarity(got, want, dim=-1).min().item()
                assert cos > 0.999, cos
                checked += 1
            e.scheduler.update_from_output(so, sampled, kvo)
        g = e.runner.graphs
        assert g.flash, "the varlen flash kernel was not used inside the graph"
        assert g.disabled is None and checked >= 10 and g.stats["replays"] >= 8, (g.disabled, checked, g.stats)
