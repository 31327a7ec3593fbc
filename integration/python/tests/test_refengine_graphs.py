"""The reference engine's CUDA-graph decode path, on the CPU: padding and buffer bookkeeping,
the fixed-shape decode attention against the eager one, and the whole fixed-shape decode
forward (run eagerly: DecodeGraphs(capture=False)) against the eager engine. The capture
itself is covered by tests/test_refengine_cuda.py on a GPU."""

import math
import random

import pytest
import torch

from orbitkv.refengine import engine_config
from orbitkv.refengine.__main__ import parse_args
from orbitkv.refengine.attention import (BatchMeta, PackedDecode, SeqSpan, attend_exact, attend_exact_fixed,
                                         attend_packed, attend_planned, plan_from_meta)
from orbitkv.refengine.engine import Engine
from orbitkv.refengine.graphs import DecodeGraphs, DecodeRow, Layout, bucket_for, buckets, capture_size

from .test_refengine import bit_exact

V = 512


def test_capture_size_pads_up_to_the_next_captured_batch():
    sizes = (1, 2, 4, 8)
    assert [capture_size(n, sizes) for n in range(1, 10)] == [1, 2, 4, 4, 8, 8, 8, 8, None]
    assert capture_size(0, sizes) is None
    assert capture_size(3, (1, 3)) == 3


def test_buckets_double_from_the_base_up_to_the_bound():
    assert buckets(256, 16384) == [256, 512, 1024, 2048, 4096, 8192, 16384]
    assert buckets(256, 1000) == [256, 512, 1024]
    assert buckets(256, 600) == [256, 512, 768]  # the bound rounded up to the base, not past it
    assert buckets(256, 100) == [256]
    bks = buckets(256, 2048)
    assert [bucket_for(n, bks) for n in (1, 256, 257, 2048, 2049)] == [256, 256, 512, 2048, None]


def _rows(specs, B, seed=0):
    """DecodeRows with (context_len, token) and distinct random blocks."""
    rng = random.Random(seed)
    free = list(range(1, 200))  # block 0: padding entries of the exact tables
    rng.shuffle(free)
    rows = []
    for i, (L, tok) in enumerate(specs):
        nb = -(-L // B)
        ids, free = free[:nb], free[nb:]
        rows.append(DecodeRow(f"r{i}", tok, L - 1, ids + [999]))  # a block past the context: ignored
    return rows


def _load(layout, rows, key):
    buf = torch.full((layout.size,), -7, dtype=torch.int64)  # stale values must not matter
    host = layout.pack(rows, key)
    buf[:host.shape[0]].copy_(host)
    return layout.views(buf, key)


def test_packed_layout_pads_with_row_zero_and_packs_contexts():
    B = 4
    lay = Layout(exact=False, max_size=8, block_size=B, max_context=64, chunk=256)
    rows = _rows([(5, 11), (9, 22), (1, 33)], B)
    key = lay.key(rows, (1, 2, 4, 8))
    assert key == (4, 256)  # 3 rows → 4; 5 + 9 + 1 + one key for the padding row
    d = _load(lay, rows, key)
    assert d.tokens.tolist() == [11, 22, 33, 11] and d.positions.tolist() == [4, 8, 0, 4]
    r0 = rows[0]
    slot0 = r0.block_ids[1] * B + 0
    assert d.slots.tolist()[0] == slot0 and d.slots.tolist()[3] == slot0
    assert d.src.tolist() == [0, 1, 2, 0]  # the padding row writes row 0's K/V into row 0's slot
    pk = d.packed
    assert pk.cu_q.tolist() == [0, 1, 2, 3, 4] and pk.cu_k.tolist() == [0, 5, 14, 15, 16] and pk.max_k == 256
    ctx = pk.ctx_slots.tolist()
    for r, lo in zip(rows, (0, 5, 14)):
        want = [r.block_ids[p // B] * B + p % B for p in range(r.context_len)]
        assert ctx[lo:lo + r.context_len] == want
    assert ctx[15] == slot0 and set(ctx[16:]) == {0}  # padding row's one key; the rest unread
    assert lay.key(_rows([(64, 1)] * 8, B), (1, 2, 4, 8)) == (8, 512)
    assert lay.key(_rows([(64, 1)] * 9, B), (1, 2, 4, 8)) is None  # no graph for 9 rows


def test_exact_layout_tables_cover_the_bucket():
    B = 4
    lay = Layout(exact=True, max_size=4, block_size=B, max_context=40, chunk=8)
    assert lay.buckets == [8, 16, 32, 40]
    rows = _rows([(5, 1), (17, 2)], B)
    key = lay.key(rows, (1, 2, 4))
    assert key == (2, 32)  # the longest context, 17 → 32
    d = _load(lay, rows, key)
    assert d.nchunks == 4 and tuple(d.tables.shape) == (2, 8)
    assert d.seq_lens.tolist() == [5, 17]
    assert d.tables[0].tolist() == rows[0].block_ids[:2] + [0] * 6
    assert d.tables[1].tolist() == rows[1].block_ids[:5] + [0] * 3
    assert lay.key(_rows([(41, 1)], B), (1, 2, 4)) is None  # longer than max_context: eager


def _pool_case(specs, B=4, Hq=4, Hkv=2, D=16, seed=0, nblocks=200):
    """A paged KV layer with random K/V, decode queries for contexts `specs`."""
    g = torch.Generator().manual_seed(seed)
    kv = torch.randn((2, nblocks, B, Hkv, D), generator=g)  # garbage everywhere: masks must hold
    rows = _rows([(L, 0) for L in specs], B, seed)
    q = torch.randn((len(specs), Hq, D), generator=g)
    return q, kv, rows


def _eager_meta(rows, B):
    seqs = [SeqSpan(i, i + 1, r.context_len, torch.tensor(list(r.block_ids[:-(-r.context_len // B)])))
            for i, r in enumerate(rows)]
    pos = torch.tensor([r.position for r in rows])
    return BatchMeta(torch.zeros(len(rows), dtype=torch.int64), pos, seqs, B, torch.arange(len(rows)))


@pytest.mark.parametrize("rows", [0, 64])
def test_fixed_exact_attention_is_attend_exact_bit_for_bit(rows):
    """Contexts inside one chunk, across chunks, on a chunk boundary; the fixed version runs
    every row over the bucket's chunks (garbage K/V past each context, masked)."""
    B, chunk = 4, 16
    q, kv, rs = _pool_case([1, 7, 16, 17, 45], B)
    kv[:, 0] = float("nan")  # what padding table entries point at: masked, not multiplied by 0
    want = attend_exact(q, kv, _eager_meta(rs, B), chunk, rows)
    lay = Layout(exact=True, max_size=8, block_size=B, max_context=128, chunk=chunk)
    key = (8, 64)  # 5 rows padded to 8, 4 chunks each (the longest context needs 3)
    d = _load(lay, rs, key)
    got = attend_exact_fixed(q[d.src], kv, d.positions, d.tables, d.seq_lens, B, chunk, d.nchunks, rows)
    assert torch.equal(got[:5], want), (got[:5] - want).abs().max()


def test_packed_attention_matches_the_eager_decode_attention():
    B = 4
    q, kv, rs = _pool_case([1, 7, 16, 17, 45], B, seed=3)
    meta = _eager_meta(rs, B)
    meta.plan = plan_from_meta(meta)
    want = attend_planned(q, kv, meta)
    lay = Layout(exact=False, max_size=8, block_size=B, max_context=64, chunk=256)
    key = lay.key(rs, (1, 2, 4, 8))
    d = _load(lay, rs, key)
    pk = d.packed
    got = attend_packed(q[d.src], kv, PackedDecode(pk.ctx_slots, pk.cu_q.int(), pk.cu_k.int(), pk.max_k), False)
    assert torch.allclose(got[:5], want, atol=1e-5, rtol=1e-5), (got[:5] - want).abs().max()
    assert torch.isfinite(got).all()  # padding rows attend to one key, not to nothing
    dense = []
    for i, r in enumerate(rs):
        slots = [r.block_ids[p // B] * B + p % B for p in range(r.context_len)]
        k = kv[0].reshape(-1, 2, 16)[slots].repeat_interleave(2, 1)
        v = kv[1].reshape(-1, 2, 16)[slots].repeat_interleave(2, 1)
        sc = torch.einsum("hd,lhd->hl", q[i], k) / math.sqrt(16)
        dense.append(torch.einsum("hl,lhd->hd", sc.softmax(-1), v))
    assert torch.allclose(got[:5], torch.stack(dense), atol=1e-5, rtol=1e-5)


def _tiny(**kw):
    kw.setdefault("kv_tokens", 2048)
    kw.setdefault("block_size", 4)
    kw.setdefault("page_tokens", 16)
    return engine_config("tiny", **kw)


def _decode_against_eager(cfg, n, exact_bits):
    """n requests with staggered lengths (the decode batch shrinks n → 1, so most steps pad),
    stepped with the fixed-shape decode path; each decode step's logits and K/V writes are
    checked against the eager forward of the same step on a copy of the pool."""
    rng = random.Random(n)
    with Engine(cfg) as e:
        e.runner.graphs = DecodeGraphs(cfg, e.model, e.pool, capture=False)
        reqs = [e.add_request([rng.randrange(V) for _ in range(9 + 3 * i)], 3 + i) for i in range(n)]
        checked = 0
        while e.has_work():
            so = e.scheduler.schedule()
            graph = e.runner._graph_step(so)
            if graph is not None:
                tok, meta, _ = e.runner._build(so)
                snap = e.pool.buffer.clone()
                want = e.model.forward(tok, meta, e.pool.layers, cfg.resolved_attn_backend, cfg.attn_chunk_tokens,
                                       rows=cfg.resolved_invariant_rows)
                want_pool = e.pool.buffer.clone()
                e.pool.buffer.copy_(snap)
            sampled, kvo = e.runner.execute(so)
            if graph is not None:
                got = e.runner.graphs.last_logits
                if exact_bits:
                    assert torch.equal(got, want) and torch.equal(e.pool.buffer, want_pool)
                else:
                    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()
                    assert torch.allclose(e.pool.buffer, want_pool, atol=1e-5, rtol=1e-5)
                checked += 1
            e.scheduler.update_from_output(so, sampled, kvo)
        assert checked == e.runner.graphs.stats["eager_fixed"] >= 3
        return [r.output_token_ids for r in reqs]


@bit_exact
@pytest.mark.parametrize("n", [3, 8])
def test_fixed_decode_exact_is_the_eager_step_bit_for_bit(n):
    cfg = _tiny(attn_backend="exact")
    got = _decode_against_eager(cfg, n, exact_bits=True)
    rng = random.Random(n)
    with Engine(cfg) as e:
        reqs = [e.add_request([rng.randrange(V) for _ in range(9 + 3 * i)], 3 + i) for i in range(n)]
        while e.has_work():
            e.step()
    assert got == [r.output_token_ids for r in reqs]


@pytest.mark.parametrize("n", [3, 8])
def test_fixed_decode_sdpa_matches_the_eager_step(n):
    _decode_against_eager(_tiny(attn_backend="sdpa"), n, exact_bits=False)


def test_fixed_decode_through_the_engine_gives_the_eager_tokens():
    ps = [[random.Random(i).randrange(V) for _ in range(20)] for i in range(5)]
    for backend in ("exact", "sdpa"):
        cfg = _tiny(attn_backend=backend)
        with Engine(cfg) as e:
            want = e.generate(ps, 6)
        with Engine(cfg) as e:
            e.runner.graphs = DecodeGraphs(cfg, e.model, e.pool, capture=False)
            assert e.generate(ps, 6) == want
            assert e.runner.graphs.stats["eager_fixed"] == 5  # 1 prefill step (eager), 5 decode steps
            e.runner.use_graphs = False
            assert e.generate(ps, 6) == want  # prefix-cached prefill, eager decode
            assert e.runner.graphs.stats["eager_fixed"] == 5


def test_no_graphs_for_batches_larger_than_max_num_seqs():
    for seqs, want in ((16, (1, 2, 4, 8)), (8, (1, 2, 4, 8)), (3, (1, 2, 4)), (1, (1,))):
        cfg = _tiny(max_num_seqs=seqs)
        with Engine(cfg) as e:
            assert DecodeGraphs(cfg, e.model, e.pool, capture=False).sizes == want


def test_cuda_graphs_setting_resolves_per_device_and_backend():
    def resolved(**kw):
        cfg = engine_config("tiny", kv_tokens=1024, **kw)
        return cfg.resolved_cuda_graphs

    assert not resolved(cuda_graphs="on")  # the CPU always runs eager steps
    assert resolved(device="cuda")          # auto: sdpa on CUDA
    assert not resolved(device="cuda", attn_backend="exact")
    assert resolved(device="cuda", attn_backend="exact", cuda_graphs="on")
    assert not resolved(device="cuda", cuda_graphs="off")
    assert engine_config("tiny", kv_tokens=1024).resolved_graph_max_context == 1024
    for bad in ({"cuda_graphs": "yes"}, {"cuda_graph_sizes": (2, 1)}, {"cuda_graph_sizes": ()},
                {"cuda_graph_max_context": -1}):
        with pytest.raises(ValueError):
            engine_config("tiny", **bad)
    assert parse_args(["--cuda-graphs", "off"]).cuda_graphs == "off"
    assert parse_args([]).cuda_graphs is None  # config default: auto


def test_step_probe_floor_and_table(capsys):
    from orbitkv.refengine import preset
    from orbitkv.refengine.steps import floor_ms, main, weight_read_bytes
    m = preset("qwen3-8b")
    assert 15.0e9 < weight_read_bytes(m) < 15.3e9  # 16.4 GB of weights less the 1.24 GB embedding table
    assert 3.15 < floor_ms(m, 8, 8 * 160, 4.8, 989) < 3.25  # weight-bound: 8 tokens, 1280 context tokens
    assert 15.5 < floor_ms(m, 1024, 1024, 4.8, 989) < 16.0  # compute-bound: 1024-token prefill
    assert main(["--backends", "sdpa,exact", "--batches", "1,3", "--decode-steps", "3", "--warmup", "1",
                 "--rounds", "1", "--kv-tokens", "1024", "--block-size", "4", "--prompt-tokens", "12"]) == 0
    out = capsys.readouterr().out.splitlines()
    rows = [line.split() for line in out[2:-1]]
    assert [(r[0], r[1], r[2], r[-1]) for r in rows] == [
        (b, n, s, f"{n}/{n}") for b in ("sdpa", "exact") for n in ("1", "3") for s in ("prefill", "decode")]


def test_a_failed_capture_turns_graphs_off_and_the_step_runs_eagerly(capsys):
    """Capturing on a machine without CUDA fails (as a capture problem on a GPU would): the
    step runs on the eager path, the engine goes on eagerly and says why."""
    ps = [[random.Random(i).randrange(V) for _ in range(20)] for i in range(3)]
    cfg = _tiny(attn_backend="sdpa")
    with Engine(cfg) as e:
        want = e.generate(ps, 5)
    with Engine(cfg) as e:
        g = e.runner.graphs = DecodeGraphs(cfg, e.model, e.pool)  # capture=True
        assert e.generate(ps, 5) == want
        assert g.disabled and g.disabled.startswith("capture of (4, 256) failed")
        assert g.stats == {"captures": 0, "replays": 0, "eager_fixed": 0}
        assert g.key(_rows([(5, 1)], 4)) is None
    assert "refengine: CUDA graphs off: capture of (4, 256) failed" in capsys.readouterr().err


def test_replay_check_exact_needs_the_same_bits_sdpa_a_close_result():
    cfg = _tiny(attn_backend="exact")
    with Engine(cfg) as e:
        g = DecodeGraphs(cfg, e.model, e.pool, capture=False)
        want = torch.randn(4, 8)
        assert g._compare((4, 256), want.clone(), want) is None
        bumped = want.clone()
        bumped[1, 2] = torch.nextafter(bumped[1, 2], torch.tensor(1e9))  # one ulp
        assert "exact mode needs the same bits" in g._compare((4, 256), bumped, want)
        g.exact = False
        assert g._compare((4, 256), bumped, want) is None
        assert "differs from the eager step" in g._compare((4, 256), want + 1.0, want)
