"""vLLM's KV tensor layouts, byte for byte through the peer.

For every layout the worker half accepts (vLLM < 0.26: FlashAttention's
(2, blocks, …) and FlashInfer's (blocks, 2, …); vLLM >= 0.26: K and V packed
in the last dim, physically NHD or HND), pages saved from some blocks and
restored into others must read back exactly, and blocks the load does not
name must stay untouched. A tensor whose bytes do not match the byte layout
the pages are keyed with is refused, not guessed at (LMCache and Dynamo
served wrong KV by assuming the old layout on vLLM 0.26)."""

from __future__ import annotations

import pytest
import torch

from orbitkv import buffers, errors, keys
from orbitkv.client import PageRef
from orbitkv.vllm import OrbitKVConnector
from orbitkv.vllm._compat import KVConnectorRole
from tests.shm import shm_pool

L, NB, BS, H, D, PT = 3, 24, 4, 2, 8, 8  # H == 2: the shape LMCache misread on vLLM 0.26
BPP = PT // BS
ELEMS = L * NB * BS * H * 2 * D


def _flash(pool):  # (2, blocks, block, heads, dim) per layer
    t = pool.view(L, 2, NB, BS, H, D)
    return [t[i] for i in range(L)]


def _flashinfer(pool):  # (blocks, 2, block, heads, dim) per layer
    t = pool.view(L, NB, 2, BS, H, D)
    return [t[i] for i in range(L)]


def _flash_hnd(pool):  # (2, blocks, block, heads, dim) per layer, memory head-major inside a block
    t = pool.view(L, 2, NB, H, BS, D)
    return [t[i].permute(0, 1, 3, 2, 4) for i in range(L)]


def _packed_nhd(pool):  # logical (blocks, heads, block, 2*dim), memory (blocks, block, heads, 2*dim)
    t = pool.view(L, NB, BS, H, 2 * D)
    return [t[i].permute(0, 2, 1, 3) for i in range(L)]


def _packed_hnd(pool):  # logical = memory (blocks, heads, block, 2*dim)
    t = pool.view(L, NB, H, BS, 2 * D)
    return [t[i] for i in range(L)]


# vLLM 0.33 (kv_cache_interface.create_kv_cache_views): one backing allocation, per-layer
# (blocks, heads, block, 2*dim) views; block-outer layouts interleave the layers per block.
def _blnhc(pool):  # memory (blocks, layers, block, heads, 2*dim)
    t = pool.view(NB, L, BS, H, 2 * D)
    return [t[:, i].permute(0, 2, 1, 3) for i in range(L)]


def _blhnc(pool):  # memory (blocks, layers, heads, block, 2*dim)
    t = pool.view(NB, L, H, BS, 2 * D)
    return [t[:, i] for i in range(L)]


def _lhbnc(pool):  # memory (layers, heads, blocks, block, 2*dim): a block is H runs
    t = pool.view(L, H, NB, BS, 2 * D)
    return [t[i].permute(1, 0, 2, 3) for i in range(L)]


def _bhlnc(pool):  # memory (blocks, heads, layers, block, 2*dim): a layer's block is H runs
    t = pool.view(NB, H, L, BS, 2 * D)
    return [t[:, :, i] for i in range(L)]


LAYOUTS = {
    "blnhc": (_blnhc, f"vllm-packed-nhd-b{BS}"),
    "blhnc": (_blhnc, f"vllm-packed-hnd-b{BS}"),
    "flash": (_flash, "vllm-flash"),
    "flashinfer": (_flashinfer, "vllm-flash"),
    "flash-hnd": (_flash_hnd, f"vllm-flash-hnd-b{BS}"),
    "packed-nhd": (_packed_nhd, f"vllm-packed-nhd-b{BS}"),
    "packed-hnd": (_packed_hnd, f"vllm-packed-hnd-b{BS}"),
}


def _extra(socket, byte_layout):
    return {
        "socket": socket, "page_tokens": PT, "block_tokens": BS,
        "layout": {"model": "orbitkv/layouts", "revision": "r0", "dtype": "fp32", "num_layers": L,
                   "kv_heads": H, "head_dim": D, "tp_size": 1, "byte_layout": byte_layout},
        "load_deadline_ms": 5000, "save_deadline_ms": 5000,
    }


def _block(layer_tensor, kind, b):
    """Every element of block b of one layer, K and V, in a fixed order."""
    if kind.startswith("flash") and kind != "flashinfer":
        return torch.stack([layer_tensor[0, b], layer_tensor[1, b]]).flatten()
    return layer_tensor[b].flatten()


@pytest.mark.parametrize("kind", sorted(LAYOUTS))
def test_page_restored_into_other_blocks_reads_back_exactly(kind, peer):
    make, byte_layout = LAYOUTS[kind]
    with shm_pool(ELEMS * 4) as (_, raw):
        pool = raw.view(torch.float32)
        pool.copy_(torch.randn(ELEMS))
        kv = {f"model.layers.{i}.self_attn.attn": t for i, t in enumerate(make(pool))}
        assert buffers.vllm_kv(kv).byte_layout == byte_layout
        work = OrbitKVConnector(_extra(peer.socket, byte_layout), KVConnectorRole.WORKER, None)
        try:
            work.register_kv_caches(kv)
            s = work.worker.session
            ks = keys.chain(s.layout.fingerprint(), PT, list(range(3 * PT)))
            src = [tuple(range(p * BPP, (p + 1) * BPP)) for p in range(3)]
            dst = [tuple(range(12 + p * BPP, 12 + (p + 1) * BPP)) for p in range(3)]
            assert s.save([PageRef(k, b) for k, b in zip(ks, src)]).wait(10).ok
            want = {(l, d): _block(t, kind, s_).clone() for l, t in enumerate(kv.values())
                    for sb, db in zip(src, dst) for s_, d in zip(sb, db)}
            untouched = {l: _block(t, kind, NB - 1).clone() for l, t in enumerate(kv.values())}
            for t in kv.values():  # poison the destinations
                for db in dst:
                    for d in db:
                        _poison(t, kind, d)
            assert s.load([PageRef(k, b) for k, b in zip(ks, dst)]).wait(10).ok
            for (l, d), w in want.items():
                got = _block(list(kv.values())[l], kind, d)
                assert torch.equal(got, w), f"{kind}: layer {l} block {d} differs after restore"
            for l, t in enumerate(kv.values()):
                assert torch.equal(_block(t, kind, NB - 1), untouched[l]), f"{kind}: layer {l} last block was written"
        finally:
            work.shutdown()


def _poison(t, kind, b):
    if kind.startswith("flash") and kind != "flashinfer":
        t[:, b].fill_(float("nan"))
    else:
        t[b].fill_(float("nan"))


@pytest.mark.parametrize("kind,keyed", [("packed-nhd", f"vllm-packed-hnd-b{BS}"), ("packed-hnd", f"vllm-packed-nhd-b{BS}"),
                                        ("packed-nhd", "vllm-flash"), ("flash", f"vllm-packed-nhd-b{BS}"),
                                        ("flash-hnd", "vllm-flash"), ("packed-nhd", f"vllm-packed-nhd-b{2 * BS}")])
def test_tensors_of_another_byte_layout_are_refused(kind, keyed, tmp_path):
    make, _ = LAYOUTS[kind]
    with shm_pool(ELEMS * 4) as (_, raw):
        kv = {f"l{i}": t for i, t in enumerate(make(raw.view(torch.float32)))}
        work = OrbitKVConnector(_extra(str(tmp_path / "none.sock"), keyed), KVConnectorRole.WORKER, None)
        try:
            with pytest.raises(errors.BufferError_, match="pages are keyed as " + keyed):
                work.register_kv_caches(kv)
        finally:
            work.shutdown()


@pytest.mark.parametrize("shape,why", [
    ((NB, H, BS, 2 * D + 2), "2\\*head_dim"),  # padded content dim
    ((NB, H, BS), "4-D .* or 5-D"),  # MLA-like
    ((2, 2, BS, H, D), "ambiguous"),
])
def test_unknown_shapes_are_refused(shape, why):
    with pytest.raises(errors.BufferError_, match=why):
        buffers.vllm_kv([torch.zeros(shape)], head_dim=D)


@pytest.mark.parametrize("make", [_lhbnc, _bhlnc], ids=["LHBNC", "BHLNC"])
def test_vllm_033_layouts_without_dense_blocks_are_refused(make):
    with shm_pool(ELEMS * 4) as (_, raw):
        with pytest.raises(errors.BufferError_, match="not dense"):
            buffers.vllm_kv(make(raw.view(torch.float32)), head_dim=D)


@pytest.mark.parametrize("env,order", [("LBNHC", "nhd"), ("BLNHC", "nhd"), ("LBHNC", "hnd"), ("BLHNC", "hnd"),
                                       ("NHD", "nhd"), ("HND", "hnd")])
def test_pages_are_keyed_in_the_order_vllm_kv_cache_layout_names(monkeypatch, env, order):
    """vLLM 0.33 names its layouts by stride order (NHD / HND are aliases): the pages
    are keyed in the order the engine will allocate, so its tensors are accepted."""
    from orbitkv.vllm import _compat

    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", env)
    assert _compat.kv_cache_layout() == order.upper()
    if _compat.HAVE_VLLM and _compat._at_least(_compat.vllm_version(), (0, 26)):
        assert _compat.vllm_byte_layout(BS) == f"vllm-packed-{order}-b{BS}"


@pytest.mark.parametrize("env", ["LHBNC", "BHLNC"])
def test_a_vllm_kv_cache_layout_without_dense_blocks_is_refused_at_start(monkeypatch, env):
    from orbitkv.vllm import _compat

    monkeypatch.setenv("VLLM_KV_CACHE_LAYOUT", env)
    with pytest.raises(ValueError, match=f"VLLM_KV_CACHE_LAYOUT={env} does not keep"):
        _compat.kv_cache_layout()


def test_packed_block_that_is_not_dense_is_refused():
    t = torch.zeros(NB, H, 2 * BS, 2 * D)[:, :, ::2]  # every other token: gaps inside the block
    with pytest.raises(errors.BufferError_, match="not dense"):
        buffers.vllm_kv([t], head_dim=D)


def test_the_block_size_is_part_of_a_packed_or_head_major_byte_layout():
    """A packed page is its blocks' first halves, then their second halves: the same
    tokens make other bytes with other block sizes, so the keys must differ too (an
    engine restarted with another --block-size must miss, not load wrong KV)."""
    def packed(bs):
        return torch.zeros(4, H, bs, 2 * D).permute(0, 1, 2, 3)

    def nhd(bs):
        return torch.zeros(4, bs, H, 2 * D).permute(0, 2, 1, 3)

    assert buffers.vllm_kv([nhd(4)]).byte_layout == "vllm-packed-nhd-b4"
    assert buffers.vllm_kv([nhd(8)]).byte_layout == "vllm-packed-nhd-b8"
    assert buffers.vllm_kv([packed(8)]).byte_layout == "vllm-packed-hnd-b8"
    assert buffers.vllm_kv([torch.zeros(2, 4, 8, H, D)]).byte_layout == "vllm-flash"  # token-major: any block size
    fps = {keys.Layout("m", "r", "fp32", 1, H, D, 0, 1, 16, bl).fingerprint()
           for bl in ("vllm-packed-nhd-b4", "vllm-packed-nhd-b8")}
    assert len(fps) == 2


def test_flash_and_flashinfer_pages_are_the_same_bytes(peer):
    """The two 5-D shapes are one byte layout: a page saved from one restores into the other."""
    with shm_pool(ELEMS * 4) as (_, raw_a), shm_pool(ELEMS * 4) as (_, raw_b):
        a, b = raw_a.view(torch.float32), raw_b.view(torch.float32)
        a.copy_(torch.randn(ELEMS))
        b.fill_(float("nan"))
        fa = {f"l{i}": t for i, t in enumerate(_flash(a))}
        fb = {f"l{i}": t for i, t in enumerate(_flashinfer(b))}
        wa = OrbitKVConnector(_extra(peer.socket, "vllm-flash"), KVConnectorRole.WORKER, None)
        wb = OrbitKVConnector(_extra(peer.socket, "vllm-flash"), KVConnectorRole.WORKER, None)
        try:
            wa.register_kv_caches(fa)
            wb.register_kv_caches(fb)
            ks = keys.chain(wa.worker.session.layout.fingerprint(), PT, list(range(900, 900 + PT)))
            assert wa.worker.session.save([PageRef(ks[0], (0, 1))]).wait(10).ok
            assert wb.worker.session.load([PageRef(ks[0], (5, 6))]).wait(10).ok
            for l in range(L):
                for sb, db in ((0, 5), (1, 6)):
                    assert torch.equal(_block(fa[f"l{l}"], "flash", sb), _block(fb[f"l{l}"], "flashinfer", db))
        finally:
            wa.shutdown()
            wb.shutdown()
