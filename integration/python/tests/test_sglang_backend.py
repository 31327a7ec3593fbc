"""The HiCache storage backend, called the way HiCache's controller calls it:
backup threads writing 128-page batches with batch_set_v1, a prefetch
thread counting hits per 128-page batch with batch_exists on every TP rank
and adopting the minimum, prefetch I/O threads reading with batch_get_v1
into other host slots; plus the legacy get/set path."""

import concurrent.futures as cf
import contextlib

import pytest
import torch

from orbitkv.sglang import OrbitKVHiCacheStorage
from orbitkv.sglang._compat import HiCacheStorageConfig
from tests.shm import shm_pool
from tests.sglang_pages import page_hashes, token_indices

PS, L, H, D = 4, 2, 2, 8
BATCH = 128  # HiCache's STORAGE_BATCH_SIZE


class HostPool:
    """Stand-in for SGLang's MHATokenToKVPoolHost (kv_buffer + geometry)."""

    def __init__(self, kv, layout, pages):
        self.kv_buffer, self.layout, self.page_size = kv, layout, PS
        self.size, self.dtype = pages * PS, kv.dtype
        self.layer_num, self.head_num, self.head_dim = L, H, D

    def page_bytes(self, page):
        from orbitkv.sglang import hostpool

        g = hostpool.geometry(self)
        return hostpool.page_view(self, g, page).contiguous().flatten().view(torch.uint8).numpy().tobytes()


def _shape(layout, pages):
    return {
        "layer_first": (2, L, pages * PS, H, D),
        "page_first": (2, pages * PS, L, H, D),
        "page_first_direct": (2, pages, L, PS, H, D),
    }[layout]


@contextlib.contextmanager
def host_pool(layout, pages, shared):
    shape = _shape(layout, pages)
    n = 2 * L * pages * PS * H * D
    if shared:
        with shm_pool(n * 2) as (_, raw):
            kv = raw.view(torch.bfloat16).view(shape)
            kv.copy_(torch.randn(shape))
            yield HostPool(kv, layout, pages)
    else:
        yield HostPool(torch.randn(shape).to(torch.bfloat16), layout, pages)


def _backend(socket, rank=0, tp=1, **extra):
    cfg = HiCacheStorageConfig(tp_rank=rank, tp_size=tp, model_name="Qwen/Qwen3-0.6B",
                               extra_config={"socket": socket, "interface_v1": 1, "staging_pages": 64, **extra})
    return OrbitKVHiCacheStorage(cfg, {})


_hashes = page_hashes


def _indices(pages):
    return token_indices(pages, PS)


@pytest.mark.parametrize("layout,shared", [
    ("layer_first", True), ("page_first_direct", True), ("page_first", True), ("layer_first", False),
])
def test_v1_concurrent_backup_and_prefetch(peer, layout, shared):
    pages = 600
    with host_pool(layout, pages, shared) as pool:
        be = _backend(peer.socket)
        be.register_mem_pool_host(pool)
        assert be.zero_copy == (shared and layout != "page_first")
        keys = _hashes(512)
        src = list(range(512))
        with cf.ThreadPoolExecutor(4) as ex:  # backup threads: 128-page batches at once
            futs = [ex.submit(be.batch_set_v1, keys[i : i + BATCH], _indices(src[i : i + BATCH])) for i in range(0, 512, BATCH)]
            assert all(all(f.result()) for f in futs)
        hit = 0
        for i in range(0, 600, BATCH):  # prefetch thread: stops at the first short batch
            batch = (keys + _hashes(88, "x"))[i : i + BATCH]
            n = be.batch_exists(batch)
            hit += n
            if n < len(batch):
                break
        assert hit == 512
        dst = [599 - p for p in range(40)]  # other slots, reversed
        want = [pool.page_bytes(p) for p in range(40)]
        with cf.ThreadPoolExecutor(2) as ex:
            a = ex.submit(be.batch_get_v1, keys[:20], _indices(dst[:20]))
            b = ex.submit(be.batch_get_v1, keys[20:40], _indices(dst[20:40]))
            assert all(a.result()) and all(b.result())
        assert [pool.page_bytes(p) for p in dst] == want
        miss = be.batch_get_v1(_hashes(2, "nope"), _indices([0, 1]))
        assert miss == [False, False]
        be.close()


def test_ranks_agree_on_minimum_hit(peer):
    with host_pool("layer_first", 300, True) as p0, host_pool("layer_first", 300, True) as p1:
        r0, r1 = _backend(peer.socket, 0, 2), _backend(peer.socket, 1, 2)
        r0.register_mem_pool_host(p0)
        r1.register_mem_pool_host(p1)
        keys = _hashes(256, "mr")
        assert r0.key(keys[0]) != r1.key(keys[0]), "ranks hold different head slices: different keys"
        assert all(r0.batch_set_v1(keys, _indices(range(256))))
        assert all(r1.batch_set_v1(keys[:150], _indices(range(150))))
        hits = []
        for be in (r0, r1):
            h = 0
            for i in range(0, 256, BATCH):
                n = be.batch_exists(keys[i : i + BATCH])
                h += n
                if n < BATCH:
                    break
            hits.append(h)
        assert hits == [256, 150] and min(hits) == 150  # the all-reduce MIN
        r0.close()
        r1.close()


def test_set_skips_pages_already_stored(peer):
    if peer.kind != "fake":
        pytest.skip("counts RPCs on the fake peer")
    with host_pool("layer_first", 64, True) as pool:
        be = _backend(peer.socket)
        be.register_mem_pool_host(pool)
        keys = _hashes(8, "skip")
        assert all(be.batch_set_v1(keys[:5], _indices(range(5))))
        before = len(peer.fake.store)
        assert all(be.batch_set_v1(keys, _indices(range(8))))
        assert len(peer.fake.store) == before + 3
        be.close()


def test_legacy_get_set(peer):
    with host_pool("page_first", 16, False) as pool:
        cfg = HiCacheStorageConfig(model_name="m", extra_config={"socket": peer.socket})
        be = OrbitKVHiCacheStorage(cfg, {})
        be.register_mem_pool_host(pool)
        from orbitkv.sglang import hostpool

        g = be.geo
        page = hostpool.canonical_to_flat(hostpool.page_view(pool, g, 3), g)
        assert be.batch_set(["aa" * 32, "bb" * 32], [page, page])
        assert be.exists("aa" * 32) and not be.exists("cc" * 32)
        target = torch.empty_like(page)
        got = be.batch_get(["aa" * 32, "cc" * 32, "bb" * 32], [target, None, None])
        assert got[0] is target and torch.equal(target, page) and got[1] is None and got[2] is None
        be.close()


def test_registration_says_how_much_sglang_prefetches_at_once(peer, caplog):
    with host_pool("page_first", 16, False) as pool, caplog.at_level("INFO", logger="orbitkv.sglang"):
        be = _backend(peer.socket)
        be.register_mem_pool_host(pool)
        be.close()
    msgs = [r.getMessage() for r in caplog.records if "prefetch from OrbitKV" in r.getMessage()]
    assert msgs and "holds 64 tokens" in msgs[0] and "in flight hold 32 tokens" in msgs[0], caplog.text


def test_mla_rejected_clearly():
    with pytest.raises(NotImplementedError, match="MLA"):
        OrbitKVHiCacheStorage(HiCacheStorageConfig(is_mla_model=True, extra_config={"socket": "x"}), {})


def test_cache_identity_policy(monkeypatch, caplog):
    """LoRA under an SGLang whose storage hashes ignore extra_key: refused unless
    share_across_extra_keys; an SGLang that seeds them with it: served, nothing
    to warn about; LoRA unknown (no server arguments): served, with a warning."""
    from orbitkv.sglang import backend as b

    cfg = lambda **x: HiCacheStorageConfig(extra_config={"socket": "x", **x})  # noqa: E731
    monkeypatch.setattr(b, "storage_hashes_namespaced", lambda: False)
    monkeypatch.setattr(b, "server_lora_enabled", lambda: True)
    with pytest.raises(ValueError, match="LoRA"):
        OrbitKVHiCacheStorage(cfg(), {})
    OrbitKVHiCacheStorage(cfg(share_across_extra_keys="true"), {})
    monkeypatch.setattr(b, "server_lora_enabled", lambda: None)
    with caplog.at_level("WARNING", logger="orbitkv.sglang"):
        OrbitKVHiCacheStorage(cfg(), {})
    assert "cache_salt" in caplog.text
    caplog.clear()
    monkeypatch.setattr(b, "storage_hashes_namespaced", lambda: True)
    monkeypatch.setattr(b, "server_lora_enabled", lambda: True)
    with caplog.at_level("WARNING", logger="orbitkv.sglang"):
        OrbitKVHiCacheStorage(cfg(), {})
    assert not caplog.text


def test_storage_metrics(peer):
    """With SGLang's storage metrics on, get_stats hands over one entry per
    zero-copy get and set (pages moved, GB/s) and clears them; pages already
    stored and misses count nothing; with metrics off it returns None, as
    SGLang's base backend does."""
    with host_pool("layer_first", 64, True) as pool:
        cfg = HiCacheStorageConfig(model_name="Qwen/Qwen3-0.6B", enable_storage_metrics=True,
                                   extra_config={"socket": peer.socket, "interface_v1": 1, "staging_pages": 64})
        be = OrbitKVHiCacheStorage(cfg, {})
        be.register_mem_pool_host(pool)
        keys = _hashes(8, "stats")
        assert all(be.batch_set_v1(keys[:5], _indices(range(5))))
        assert all(be.batch_set_v1(keys, _indices(range(8))))  # 5 already stored: 3 written
        assert all(be.batch_get_v1(keys[:6], _indices(range(40, 46))))
        assert be.batch_get_v1(_hashes(2, "stats-miss"), _indices([50, 51])) == [False, False]
        st = be.get_stats()
        assert st.backup_pgs == [5, 3] and st.prefetch_pgs == [6]
        assert len(st.backup_bandwidth) == 2 and len(st.prefetch_bandwidth) == 1
        assert all(bw > 0 for bw in st.backup_bandwidth + st.prefetch_bandwidth)
        again = be.get_stats()
        assert (again.prefetch_pgs, again.backup_pgs, again.prefetch_bandwidth, again.backup_bandwidth) == ([], [], [], [])
        be.close()
        off = _backend(peer.socket)
        off.register_mem_pool_host(pool)
        assert off.batch_get_v1(keys[:2], _indices([60, 61])) == [True, True]
        assert off.get_stats() is None
        off.close()
