"""The HiCache backend against the installed SGLang package (CPU tensors):
SGLang's own HiCacheStorage ABC, HiCacheStorageConfig, PoolTransfer and
PoolHitPolicy, its dynamic-backend factory, its real MHA host memory pool
(MHATokenToKVPoolHost over a real MHATokenToKVPool) in every host layout,
its HiCacheFile backend as the reference for the v2 hit policies, and its
HiCacheController's backup / prefetch / prefetch-I/O threads driving it.

Skips without SGLang (the plain /usr/bin/python3 suite); `make test` runs
this file in the environment scripts/install-sglang.sh builds, with
ORBITKV_REQUIRE=sglang so a missing SGLang fails instead of skipping."""

from __future__ import annotations

import inspect
import os
import signal

import pytest

if os.environ.get("ORBITKV_REQUIRE") != "sglang":
    pytest.importorskip("sglang.srt.mem_cache.hicache_storage",
                        reason="SGLang is not installed here (make test-sglang runs this in its environment)")

import sglang.version  # noqa: E402
import torch  # noqa: E402
from sglang.srt.mem_cache import hicache_storage as hs  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

from orbitkv.sglang import OrbitKVHiCacheStorage, _compat  # noqa: E402
from tests.fixtures import wait_until  # noqa: E402
from tests.sglang_pages import page_hashes, token_indices

PoolName, PoolHitPolicy, PoolTransfer = hs.PoolName, hs.PoolHitPolicy, hs.PoolTransfer
PS, L, H, D = 4, 2, 2, 8
DEVICE_TOKENS = 128  # the host pool gets DEVICE_TOKENS // PS + 1 pages
LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_head"]
UP_WITHIN_S = 10.0
# The two releases `make test` runs this file under (test-sglang, test-sglang0523). 0.5.23 is
# HiCache v2: its page hashes are seeded with a request's extra_key and cache salt, its plain MHA
# server drives storage through a HybridCacheController over a HostPoolGroup, and its host pool
# is built from the device pool's buffer description.
SGLANG = tuple(int(x) for x in sglang.version.__version__.split(".")[:3])
HICACHE_V2 = SGLANG >= (0, 5, 23)


def real_pools(layout, layers=L, heads=H, dim=D, dtype=torch.bfloat16, **host_kw):
    """SGLang's own device pool and host pool on CPU (the host pool built the way
    the installed SGLang builds it), the host pool filled with random values."""
    dev = MHATokenToKVPool(size=DEVICE_TOKENS, page_size=PS, dtype=dtype, head_num=heads, head_dim=dim,
                           layer_num=layers, device="cpu", enable_memory_saver=False)
    hp = _compat.build_mha_host_pool(dev, 1.0, 0, PS, layout, pin_memory=False, device="cpu", **host_kw)
    hp.kv_buffer.copy_(torch.randn(hp.kv_buffer.shape).to(dtype))
    return dev, hp


def real_host_pool(layout, **kw):
    return real_pools(layout, **kw)[1]


def page_bytes(hp, page):
    return hp.get_data_page(page * PS, flat=True).contiguous().view(torch.uint8).numpy().tobytes()


def config(socket, tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, v1=True, **kw):
    extra = {"backend_name": "orbitkv", "module_path": "orbitkv.sglang", "class_name": "OrbitKVHiCacheStorage",
             "socket": socket, "staging_pages": 32}
    if v1:
        extra["interface_v1"] = 1
    args = dict(tp_rank=tp_rank, tp_size=tp_size, pp_rank=pp_rank, pp_size=pp_size, attn_cp_rank=0, attn_cp_size=1,
                is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                model_name="Qwen/Qwen3-8B", extra_config=extra)
    args.update(kw)
    return hs.HiCacheStorageConfig(**args)


def backend(socket, pool, **kw):
    be = OrbitKVHiCacheStorage(config(socket, **kw), {})
    be.register_mem_pool_host(pool)
    return be


hashes = page_hashes


def indices(pages):
    return token_indices(pages, PS)


# --- the contract -----------------------------------------------------------------


IMPLEMENTED = ["get", "batch_get", "set", "batch_set", "exists", "batch_exists", "batch_get_v1", "batch_set_v1",
               "register_mem_pool_host", "register_mem_host_pool_v2", "batch_exists_v2", "batch_get_v2",
               "batch_set_v2", "clear"]


def test_backend_implements_the_installed_abc():
    assert _compat.HAVE_SGLANG and issubclass(OrbitKVHiCacheStorage, hs.HiCacheStorage)
    assert not OrbitKVHiCacheStorage.__abstractmethods__
    for name in IMPLEMENTED:
        base, ours = getattr(hs.HiCacheStorage, name), getattr(OrbitKVHiCacheStorage, name)
        assert ours is not base, f"{name} is the base's (returns None or raises NotImplementedError)"
        bp = [p for p in inspect.signature(base).parameters if p != "self"]
        op = [p for p in inspect.signature(ours).parameters if p != "self"]
        assert len(op) >= len(bp), (name, bp, op)


def test_created_by_sglangs_dynamic_factory(peer):
    hp = real_host_pool("layer_first")
    be = StorageBackendFactory.create_backend("dynamic", config(peer.socket), hp)
    try:
        assert isinstance(be, OrbitKVHiCacheStorage)
        be.register_mem_pool_host(hp)  # what HiCacheController does next
        ks = hashes(3, "factory")
        assert be.batch_set_v1(ks, indices([0, 1, 2])) == [True] * 3
        assert be.batch_exists(ks) == 3
    finally:
        be.close()


def test_split_heads_and_mla_are_refused():
    with pytest.raises(NotImplementedError, match="tp_lcm_size"):
        OrbitKVHiCacheStorage(config("x", tp_size=2, tp_lcm_size=4, should_split_heads=True), {})
    with pytest.raises(NotImplementedError, match="MLA"):
        OrbitKVHiCacheStorage(config("x", is_mla_model=True), {})


# --- cache identity: SGLang's extra_key (cache salt + LoRA id) ------------------------


@pytest.mark.skipif(HICACHE_V2, reason="SGLang >= 0.5.23 namespaces its storage hashes (the next test)")
def test_the_installed_sglang_hashes_storage_pages_over_token_ids_only():
    """The premise of the LoRA refusal: SGLang 0.5.17's HiCache controller hashes
    storage pages with get_hash_str(token_ids, prior_hash, page_size), and hands a
    backend only those hashes and prefix_keys — never the request's extra_key. If
    this fails, the installed SGLang changed: re-read how it keys storage pages."""
    from sglang.srt.managers import cache_controller
    from sglang.srt.mem_cache import utils

    from orbitkv.sglang.backend import storage_hashes_namespaced

    assert list(inspect.signature(utils.get_hash_str).parameters) == ["token_ids", "prior_hash", "page_size"]
    assert "extra_key" not in inspect.getsource(cache_controller.HiCacheController._storage_hit_query)
    assert "extra_key" not in {f.name for f in __import__("dataclasses").fields(hs.HiCacheStorageExtraInfo)}
    assert not storage_hashes_namespaced()
    # equal tokens, any salt or adapter: one page hash
    assert utils.get_hash_str([1, 2, 3, 4], None, page_size=4) == utils.get_hash_str([1, 2, 3, 4], None, page_size=4)


@pytest.mark.skipif(not HICACHE_V2, reason="SGLang 0.5.17 hashes token ids only (the test before)")
def test_the_installed_sglang_seeds_storage_hashes_with_extra_key_and_salt():
    """SGLang 0.5.23 still hands a backend page hashes only (no extra_key field), but
    seeds each chain with the request's extra_key (LoRA id) and cache salt
    (get_storage_hash_str over a RadixKey, storage_namespace_seed): equal tokens of
    another adapter or salt hash apart, so their OrbitKV keys differ; a request with
    neither keeps the plain token hash."""
    from sglang.srt.mem_cache import utils
    from sglang.srt.mem_cache.radix_cache import RadixKey

    from orbitkv.sglang.backend import storage_hashes_namespaced

    assert storage_hashes_namespaced()
    assert "extra_key" not in {f.name for f in __import__("dataclasses").fields(hs.HiCacheStorageExtraInfo)}
    tokens = list(range(8))

    def h(**ns):
        return utils.get_storage_hash_str(RadixKey(tokens, **ns), None, page_size=PS)

    chains = [h(), h(extra_key="sql"), h(extra_key="chat"), h(cache_salt="tenant-a"), h(extra_key="sql", cache_salt="tenant-a")]
    assert len({c[0] for c in chains}) == len({c[1] for c in chains}) == 5
    assert chains[0] == utils.get_hash_str(tokens, None, page_size=PS) and h(extra_key="sql") == chains[1]
    be = OrbitKVHiCacheStorage(config("x"), {})
    assert len({be.key(c[0]) for c in chains}) == 5


def _server_args(monkeypatch, **args):
    import types

    from sglang.srt import server_args

    monkeypatch.setattr(server_args, "get_global_server_args", lambda: types.SimpleNamespace(**args))


@pytest.mark.parametrize("args", [{"enable_lora": True}, {"lora_paths": ["sql=/adapters/sql"]}])
def test_a_lora_server_is_refused_unless_sharing_is_declared(monkeypatch, caplog, args):
    """Under an SGLang whose storage hashes ignore extra_key (0.5.17) a LoRA server
    is refused; under one that seeds them with it (0.5.23) it starts and says why."""
    _server_args(monkeypatch, **args)
    if HICACHE_V2:
        with caplog.at_level("INFO", logger="orbitkv.sglang"):
            be = StorageBackendFactory.create_backend("dynamic", config("x"), None)
        assert isinstance(be, OrbitKVHiCacheStorage) and not be.share_across_extra_keys
        assert "never share an OrbitKV key" in caplog.text and "WARNING" not in caplog.text
        return
    with pytest.raises(ValueError, match="LoRA enabled.*extra_key.*share_across_extra_keys"):
        OrbitKVHiCacheStorage(config("x"), {})
    with pytest.raises(ValueError, match="LoRA enabled"):  # through SGLang's own factory, as a server starts it
        StorageBackendFactory.create_backend("dynamic", config("x"), None)
    cfg = config("x")
    cfg.extra_config["share_across_extra_keys"] = True
    with caplog.at_level("WARNING", logger="orbitkv.sglang"):
        be = OrbitKVHiCacheStorage(cfg, {})
    assert be.share_across_extra_keys and "share_across_extra_keys is set" in caplog.text


def test_without_lora_it_starts_and_says_whether_salts_are_isolated(monkeypatch, caplog):
    _server_args(monkeypatch, enable_lora=False, lora_paths=None)
    with caplog.at_level("INFO", logger="orbitkv.sglang"):
        OrbitKVHiCacheStorage(config("x"), {})
    if HICACHE_V2:
        assert "adapters and salts never share an OrbitKV key" in caplog.text and "tenant isolation" not in caplog.text
    else:
        assert "token ids only" in caplog.text and "cache_salt" in caplog.text and "tenant isolation" in caplog.text


# --- v1 (zero-copy controller path) and the generic get/set path --------------------


@pytest.mark.parametrize("layout", LAYOUTS)
def test_v1_round_trip_on_real_host_pool(peer, layout):
    hp = real_host_pool(layout)
    be = backend(peer.socket, hp)
    try:
        assert not be.zero_copy  # SGLang's pool is anonymous shared memory: staged
        ks = hashes(12, layout)
        want = [page_bytes(hp, p) for p in range(12)]
        assert be.batch_set_v1(ks, indices(range(12))) == [True] * 12
        assert be.batch_exists(ks + hashes(2, "absent")) == 12
        dst = [32 - p for p in range(12)]
        assert be.batch_get_v1(ks, indices(dst)) == [True] * 12
        assert [page_bytes(hp, p) for p in dst] == want
        assert be.batch_get_v1(hashes(2, "absent"), indices([0, 1])) == [False, False]
    finally:
        be.close()


_COLLECTOR: list = []


def test_storage_metrics_reach_sglangs_collector(peer):
    """With enable_storage_metrics, get_stats hands SGLang's own
    StorageMetrics (its collector asserts the type) with the pages of each
    get and set, and SGLang's collector logs them into its histograms."""
    from sglang.srt.observability.metrics_collector import StorageMetrics, StorageMetricsCollector

    hp = real_host_pool("layer_first")
    be = backend(peer.socket, hp, enable_storage_metrics=True)
    try:
        ks = hashes(6, "metrics")
        assert be.batch_set_v1(ks, indices(range(6))) == [True] * 6
        assert be.batch_get_v1(ks[:4], indices([20, 21, 22, 23])) == [True] * 4
        st = be.get_stats()
        assert isinstance(st, StorageMetrics)
        assert st.backup_pgs == [6] and st.prefetch_pgs == [4]
        assert all(bw > 0 for bw in st.backup_bandwidth + st.prefetch_bandwidth)
        if not _COLLECTOR:  # its series register in the process's registry: once
            _COLLECTOR.append(StorageMetricsCollector(labels={"storage_backend": "orbitkv"}))
        _COLLECTOR[0].log_storage_metrics(st)
        assert be.get_stats().prefetch_pgs == []
    finally:
        be.close()


@pytest.mark.parametrize("layout", ["page_first_direct", "layer_first"])
def test_sglang_shm_allocator_pool_is_mapped_zero_copy(peer, layout):
    """SGLang's "allocator":"shm" host pool is a memfd: the backend hands the peer
    /proc/PID/fd/N, the peer maps the pool itself and pages move with no staging copy."""
    hp = real_host_pool(layout, allocator_type="shm")
    be = backend(peer.socket, hp)
    try:
        assert be.zero_copy and be.staging is None
        ks = hashes(4, "shm-" + layout)
        want = [page_bytes(hp, p) for p in range(4)]
        assert be.batch_set_v1(ks, indices(range(4))) == [True] * 4
        assert be.batch_get_v1(ks, indices([9, 8, 7, 6])) == [True] * 4
        assert [page_bytes(hp, p) for p in (9, 8, 7, 6)] == want
    finally:
        be.close()


@pytest.mark.parametrize("layout", LAYOUTS)
def test_generic_get_set_the_way_the_controller_calls_them(peer, layout):
    hp = real_host_pool(layout)
    be = backend(peer.socket, hp, v1=False)
    try:
        ks = hashes(5, "generic" + layout)
        data = [hp.get_data_page(indices([p])[0]) for p in range(5)]  # HiCacheController._generic_page_set
        want = [page_bytes(hp, p) for p in range(5)]
        assert be.batch_set(ks, data)
        dummy = [hp.get_dummy_flat_data_page() for _ in range(6)]  # _generic_page_get
        got = be.batch_get(ks + hashes(1, "absent"), dummy)
        assert got[5] is None and all(g is not None for g in got[:5])
        for i, page in enumerate(got[:5]):
            hp.set_from_flat_data_page(indices([20 + i])[0], page)
        assert [page_bytes(hp, 20 + i) for i in range(5)] == want
        assert be.exists(ks[0]) and not be.exists(hashes(1, "absent")[0])
    finally:
        be.close()


# --- v2: extra pools and hit policies ---------------------------------------------------


def _file_backend(tmp):
    return hs.HiCacheFile(config("unused"), file_path=os.path.join(tmp, "hicache-file"))


def test_v2_hit_policies_match_sglangs_file_backend(peer, tmpdir_short):
    """batch_exists_v2 answers what the installed SGLang's HiCacheFile answers: 0.5.23's
    set of restorable prefix lengths included (two trailing pools: the longest length
    both restore, where 0.5.17's answer is the shorter of their longest)."""
    kv, draft, swa = real_host_pool("layer_first"), real_host_pool("layer_first", layers=1), real_host_pool("page_first")
    ours, ref = backend(peer.socket, kv), _file_backend(tmpdir_short)
    ref.register_mem_pool_host(kv)
    try:
        for be in (ours, ref):
            be.register_mem_host_pool_v2(draft, PoolName.DRAFT)
            be.register_mem_host_pool_v2(swa, PoolName.SWA)
        ks = hashes(8, "policy")
        assert ours.batch_set_v1(ks[:6], indices(range(6))) == [True] * 6
        assert ref.batch_set(ks[:6], [kv.get_data_page(p * PS) for p in range(6)])
        for be in (ours, ref):  # the draft pool holds pages 0, 1 and 4 only; the SWA pool 0, 1 and 2
            for name, pages in ((PoolName.DRAFT, [0, 1, 4]), (PoolName.SWA, [0, 1, 2])):
                got = be.batch_set_v2([PoolTransfer(name, host_indices=indices(pages), keys=[ks[p] for p in pages])])
                assert list(got.values()) == [[True] * 3]
        trailing = PoolHitPolicy.TRAILING_PAGES
        cases = [
            [],
            [PoolTransfer(PoolName.DRAFT, keys=[ks[0]], hit_policy=PoolHitPolicy.ALL_PAGES)],
            [PoolTransfer(PoolName.DRAFT, keys=[ks[0]], hit_policy=trailing)],
            [PoolTransfer(PoolName.DRAFT, keys=ks[:2], hit_policy=trailing)],
            [PoolTransfer(PoolName.DRAFT, keys=[ks[0]], hit_policy=trailing),
             PoolTransfer(PoolName.SWA, keys=[ks[0]], hit_policy=trailing)],
        ]
        seen = []
        for transfers in cases:
            r_ours, r_ref = ours.batch_exists_v2(ks, transfers), ref.batch_exists_v2(ks, transfers)
            assert isinstance(r_ours, hs.PoolTransferResult)
            assert (r_ours.kv_hit_pages, r_ours.extra_pool_hit_pages) == (r_ref.kv_hit_pages, r_ref.extra_pool_hit_pages)
            assert getattr(r_ours, "restorable_prefix_pages", None) == getattr(r_ref, "restorable_prefix_pages", None)
            seen.append(r_ours.kv_hit_pages)
        # KV prefix; all pages; last page (4); last two (0, 1); draft {1, 2, 5} and SWA {1, 2, 3}
        assert seen == [6, 2, 5, 2, 2 if HICACHE_V2 else 3]
        if HICACHE_V2:
            assert ours.batch_exists_v2(ks, cases[4]).restorable_prefix_pages == [1, 2]
    finally:
        ours.close()


def test_v2_extra_pool_round_trip_and_registration_errors(peer):
    kv, draft = real_host_pool("page_first"), real_host_pool("page_head", layers=1, heads=1)
    be = backend(peer.socket, kv)
    try:
        be.register_mem_host_pool_v2(kv, PoolName.KV)  # the KV pool is the backend itself
        be.register_mem_host_pool_v2(draft, PoolName.DRAFT)
        ks = hashes(4, "draft")
        assert be._lane(PoolName.DRAFT).key(ks[0]) != be.key(ks[0])
        want = [page_bytes(draft, p) for p in range(4)]
        t = PoolTransfer(PoolName.DRAFT, host_indices=indices(range(4)), keys=ks)
        assert be.batch_set_v2([t]) == {PoolName.DRAFT: [True] * 4}
        assert be.batch_exists(ks) == 0  # draft pages are not KV pages
        back = PoolTransfer(PoolName.DRAFT, host_indices=indices([10, 11, 12, 13]), keys=ks)
        assert be.batch_get_v2([back]) == {PoolName.DRAFT: [True] * 4}
        assert [page_bytes(draft, p) for p in (10, 11, 12, 13)] == want
        with pytest.raises(KeyError, match="swa"):
            be.batch_get_v2([PoolTransfer(PoolName.SWA, host_indices=indices([0]), keys=ks[:1])])
        with pytest.raises(NotImplementedError, match="MHA"):
            be.register_mem_host_pool_v2(object(), PoolName.MAMBA)
    finally:
        be.close()


# --- ranks --------------------------------------------------------------------------------


def test_tp_ranks_and_pp_stages_keep_their_pages_apart(peer):
    pools = [real_host_pool("layer_first") for _ in range(4)]
    r0, r1 = backend(peer.socket, pools[0], tp_size=2), backend(peer.socket, pools[1], tp_rank=1, tp_size=2)
    s0, s1 = backend(peer.socket, pools[2], pp_size=2), backend(peer.socket, pools[3], pp_rank=1, pp_size=2)
    try:
        ks = hashes(10, "ranks")
        assert len({be.key(ks[0]) for be in (r0, r1, s0, s1)}) == 4
        assert r0.batch_set_v1(ks, indices(range(10))) == [True] * 10
        assert r1.batch_set_v1(ks[:7], indices(range(7))) == [True] * 7
        assert s0.batch_set_v1(ks[:3], indices(range(3))) == [True] * 3
        hits = [be.batch_exists(ks) for be in (r0, r1, s0, s1)]
        assert hits == [10, 7, 3, 0] and min(hits[:2]) == 7  # the prefetch all-reduce MIN over TP
    finally:
        for be in (r0, r1, s0, s1):
            be.close()


# --- the peer down and restarted ----------------------------------------------------------------


def test_peer_never_up_every_call_answers_a_miss(tmpdir_short):
    kv, draft = real_host_pool("page_first_direct"), real_host_pool("layer_first", layers=1)
    be = backend(os.path.join(tmpdir_short, "nobody.sock"), kv)
    try:
        be.register_mem_host_pool_v2(draft, PoolName.DRAFT)
        ks, idx = hashes(3, "down"), indices([0, 1, 2])
        assert hs.HiCacheStorage.batch_get_v1(be, ks, idx) is None  # what SGLang's base would answer
        assert be.batch_get_v1(ks, idx) == [False] * 3 and be.batch_set_v1(ks, idx) == [False] * 3
        assert be.batch_exists(ks) == 0 and not be.exists(ks[0])
        r = be.batch_exists_v2(ks, [PoolTransfer(PoolName.DRAFT, keys=ks[:1])])
        assert (r.kv_hit_pages, r.extra_pool_hit_pages) == (0, {})
        t = PoolTransfer(PoolName.DRAFT, host_indices=idx, keys=ks)
        assert be.batch_set_v2([t]) == {PoolName.DRAFT: [False] * 3} == be.batch_get_v2([t])
    finally:
        be.close()


def test_peer_killed_then_back(real_peer):
    hp = real_host_pool("layer_first")
    be = backend(real_peer.socket, hp)
    try:
        ks = hashes(6, "kill")
        assert be.batch_set_v1(ks[:3], indices(range(3))) == [True] * 3
        real_peer.stop(signal.SIGKILL)
        assert be.batch_set_v1(ks[3:], indices(range(3, 6))) == [False] * 3  # a miss, not an exception
        assert be.batch_get_v1(ks[:3], indices([20, 21, 22])) == [False] * 3
        assert be.batch_exists(ks) == 0
        real_peer.start()
        wait_until(lambda: be.available, UP_WITHIN_S, "backend session reopened")
        want = [page_bytes(hp, p) for p in range(6)]
        assert be.batch_set_v1(ks, indices(range(6))) == [True] * 6
        assert be.batch_exists(ks) == 6
        assert be.batch_get_v1(ks, indices(range(20, 26))) == [True] * 6
        assert [page_bytes(hp, p) for p in range(20, 26)] == want
    finally:
        be.close()


def test_peer_restarted_backend_carries_on(peer):
    hp = real_host_pool("page_head")
    be = backend(peer.socket, hp)
    try:
        ks = hashes(4, "restart")
        assert be.batch_set_v1(ks, indices(range(4))) == [True] * 4
        gen = be.session.generation
        peer.restart()
        assert be.batch_set_v1(ks, indices(range(4))) in ([True] * 4, [False] * 4)  # never raises
        wait_until(lambda: be.available and be.session.generation > gen, UP_WITHIN_S, "session reopened")
        assert be.batch_set_v1(ks, indices(range(4))) == [True] * 4
        assert be.batch_get_v1(ks, indices(range(10, 14))) == [True] * 4
        assert [page_bytes(hp, p) for p in range(10, 14)] == [page_bytes(hp, p) for p in range(4)]
    finally:
        be.close()


# --- SGLang's own HiCacheController driving the backend ----------------------------------------


@pytest.fixture
def controller_factory(monkeypatch):
    """Builds SGLang's HiCache controller (its backup, prefetch and prefetch
    I/O threads) over a real CPU host pool with the OrbitKV backend attached
    through the `dynamic` factory, as the installed SGLang's server does for a
    plain MHA model: 0.5.17 a HiCacheController on the host pool; 0.5.23 a
    HybridCacheController on a HostPoolGroup whose one entry is that pool, the
    KV anchor (what its build_kv_only_stack makes). A single process: the
    distributed runtime context SGLang's scheduler would set up is replaced by
    rank 0 of 1."""
    import threading
    import types

    from sglang.srt.managers import cache_controller as cc

    monkeypatch.setattr(cc, "is_dp_attention_enabled", lambda: False)
    monkeypatch.setattr(cc, "get_parallel", lambda: types.SimpleNamespace(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_dcp_size=1, attn_dcp_rank=0))
    made = []

    def make(socket, layout="layer_first", v1=True):
        dev, hp = real_pools(layout)
        extra = dict(config(socket, v1=v1).extra_config)
        kw = dict(storage_backend="dynamic", prefetch_threshold=PS, model_name="Qwen/Qwen3-8B",
                  storage_backend_extra_config=extra)
        allocator = types.SimpleNamespace(get_kvcache=lambda: dev)
        if HICACHE_V2:
            from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
            from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import build_pool_entry
            from sglang.srt.mem_cache.pool_host.group import HostPoolGroup

            group = HostPoolGroup([build_pool_entry(name=PoolName.KV, host_pool=hp, device_pool=dev,
                                                    layer_mapping={i: i for i in range(dev.layer_num)},
                                                    transfer_layer_id_max=dev.layer_num, is_anchor=True)])
            ctl = HybridCacheController(allocator, group, PS, None, threading.Event(),
                                        transfer_layer_id_max=dev.layer_num, **kw)
        else:
            ctl = cc.HiCacheController(allocator, hp, PS, None, threading.Event(), **kw)
        made.append(ctl)
        return ctl, hp

    yield make
    for ctl in made:
        ctl._stop_storage_threads()
        ctl.storage_backend.close()


def _page_hashes(ctl, key):
    """The page hashes SGLang's tree gives a node's key (0.5.23: seeded with
    the key's extra_key and cache salt)."""
    if HICACHE_V2:
        from sglang.srt.mem_cache.utils import get_storage_hash_str

        return get_storage_hash_str(key, None, page_size=PS)
    return ctl.get_hash_str(key, None, page_size=PS)


def _key(tokens, **namespace):
    """A request's tokens as the installed SGLang's radix cache hands them to
    the controller (0.5.23: a RadixKey with its extra_key and cache salt)."""
    if not HICACHE_V2:
        assert not namespace, "SGLang 0.5.17's controller takes token ids only"
        return tokens
    from sglang.srt.mem_cache.radix_cache import RadixKey

    return RadixKey(tokens, **namespace)


def _backup(ctl, key, host):
    op_id = ctl.write_storage(host, key, hash_value=_page_hashes(ctl, key))
    op = ctl.ack_backup_queue.get(timeout=UP_WITHIN_S * 3)
    assert op.id == op_id
    return op


def _prefetch_hit(ctl, rid, key):
    """The storage hit the prefetch thread reports for a request."""
    if HICACHE_V2:
        from sglang.srt.mem_cache.base_prefix_cache import CacheRequestHandle

        ctl.prefetch(CacheRequestHandle(rid, 0), key)
    else:
        ctl.prefetch(rid, key)
    return ctl.prefetch_hit_queue.get(timeout=UP_WITHIN_S * 3)


def _prefetched_tokens(ctl, hit):
    """Hands the hit to the I/O thread with host slots (what the scheduler
    does) and returns the tokens it loaded: 0.5.17 counts them on the
    operation; 0.5.23 reports them in acks (cumulative, one per batch, then
    one that ends the request) on ack_prefetch_queue."""
    ctl.prefetch_buffer.put(hit)
    io = ctl.prefetch_io_aux_thread
    if not HICACHE_V2:
        want = hit.storage_hit_count
        wait_until(lambda: hit.completed_tokens == want or not io.is_alive(), UP_WITHIN_S * 3, "prefetch I/O done")
        assert io.is_alive()
        return hit.completed_tokens
    done = 0
    while True:
        ack = ctl.ack_prefetch_queue.get(timeout=UP_WITHIN_S * 3)
        assert ack.rid == hit.request_id
        if ack.completed_tokens is not None:
            done = max(done, ack.completed_tokens)
        if ack.completed_req:
            assert io.is_alive()
            return done


@pytest.mark.parametrize("v1", [True, False], ids=["interface_v1", "generic"])
def test_hicache_controller_backs_up_and_prefetches(peer, controller_factory, v1):
    ctl, hp = controller_factory(peer.socket, "page_first", v1)
    assert isinstance(ctl.storage_backend, OrbitKVHiCacheStorage)
    assert ctl.page_set_func.__name__ == ("_page_set_zero_copy" if v1 else "_generic_page_set")
    tokens = list(range(100, 100 + 8 * PS))
    assert _backup(ctl, _key(tokens), indices(range(8))).completed_tokens == 8 * PS
    hit = _prefetch_hit(ctl, "r1", _key(tokens + [7, 7]))  # a partial last page is not looked up
    assert hit.storage_hit_count == 8 * PS
    hit.host_indices = indices(range(16, 24))  # what the scheduler allocates
    assert _prefetched_tokens(ctl, hit) == 8 * PS
    assert [page_bytes(hp, p) for p in range(16, 24)] == [page_bytes(hp, p) for p in range(8)]


@pytest.mark.skipif(not HICACHE_V2, reason="SGLang 0.5.17's controller takes token ids only: no namespace to keep apart")
def test_hicache_controller_keeps_adapters_and_salts_apart(peer, controller_factory, monkeypatch):
    """Through SGLang 0.5.23's own controller: pages one adapter backed up are found
    for that adapter's requests only, never for another adapter's, another salt's or
    a request with neither; and a LoRA server is accepted (its hashes carry the id)."""
    _server_args(monkeypatch, enable_lora=True, lora_paths=None)
    ctl, hp = controller_factory(peer.socket)
    tokens = list(range(300, 300 + 6 * PS))
    assert _backup(ctl, _key(tokens, extra_key="sql"), indices(range(6))).completed_tokens == 6 * PS
    misses = [_key(tokens, extra_key="chat"), _key(tokens), _key(tokens, extra_key="sql", cache_salt="tenant-b")]
    assert [_prefetch_hit(ctl, f"miss{i}", k).storage_hit_count for i, k in enumerate(misses)] == [0, 0, 0]
    hit = _prefetch_hit(ctl, "same", _key(tokens, extra_key="sql"))
    assert hit.storage_hit_count == 6 * PS
    hit.host_indices = indices(range(20, 26))
    assert _prefetched_tokens(ctl, hit) == 6 * PS
    assert [page_bytes(hp, p) for p in range(20, 26)] == [page_bytes(hp, p) for p in range(6)]


def test_registration_logs_sglangs_own_prefetch_bound(peer, controller_factory, caplog):
    """The bound the backend logs when SGLang's controller registers its host
    pool is the controller's own prefetch_capacity_limit."""
    with caplog.at_level("INFO", logger="orbitkv.sglang"):
        ctl, hp = controller_factory(peer.socket)
    limit = ctl.prefetch_capacity_limit
    assert 0 < limit < hp.size
    want = f"holds {hp.size} tokens; SGLang starts no prefetch from OrbitKV while those in flight hold {limit} tokens"
    assert any(want in r.getMessage() for r in caplog.records), caplog.text


def test_the_sglang_path_bench_runs_and_checks_its_bytes():
    """scripts/bench-sglang-path.py (make bench-sglang) on a few pages: it starts
    a real peer, registers SGLang's shm host pool zero copy, and compares every
    page it gets back with the page it set (timings are not judged here)."""
    import subprocess
    import sys

    from tests.fixtures import real_peer_bin

    binary = real_peer_bin()
    if binary is None:
        pytest.skip("needs ORBITKV_BIN (the real peer)")
    root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))  # the repository
    env = dict(os.environ, PYTHONPATH=os.path.join(root, "integration", "python"), ORBITKV_BIN=binary)
    r = subprocess.run([sys.executable, os.path.join(root, "scripts", "bench-sglang-path.py"), "--pages", "4", "--reps", "2"],
                       env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "every get's bytes equal the pages set" in r.stdout and "× memmove" in r.stdout, r.stdout


def test_hicache_controller_threads_survive_a_peer_that_is_down(controller_factory, tmpdir_short):
    ctl, _ = controller_factory(os.path.join(tmpdir_short, "nobody.sock"))
    tokens = list(range(5, 5 + 4 * PS))
    assert _backup(ctl, _key(tokens), indices(range(4))).completed_tokens == 0  # not stored, not crashed
    if HICACHE_V2:  # the hit goes to the scheduler, which revokes a prefetch below its threshold
        assert _prefetch_hit(ctl, "r-down", _key(tokens)).storage_hit_count == 0
    else:
        ctl.prefetch("r-down", tokens)
        assert ctl.prefetch_revoke_queue.get(timeout=UP_WITHIN_S * 3) == "r-down"  # no hits: revoked
    assert ctl.prefetch_thread.is_alive() and ctl.backup_thread.is_alive() and ctl.prefetch_io_aux_thread.is_alive()
