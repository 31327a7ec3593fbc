"""OrbitKVTier under vLLM 0.33's own tiering classes (installed vLLM, CPU) and
the real peer binary: vLLM's TieringOffloadingSpec builds its CPU primary tier
and loads the tier by module path; its TieringOffloadingManager cascades
stores to it and promotes lookups from it.

vLLM's CPU offloading cannot run whole on a CPU platform (its offloading
worker, the GPU <-> CPU copier, refuses to start without CUDA or XPU), so
these tests drive the tiering manager directly, the way the OffloadingConnector
scheduler does, and play the GPU side by writing and reading the CPU rows
vLLM hands out (tests/vtier_harness.py).

Skips without vLLM (the plain /usr/bin/python3 suite); `make test-vllm033`
runs it in the vLLM 0.33 environment with ORBITKV_REQUIRE=vllm."""

from __future__ import annotations

import os
import signal
import threading
import time

import numpy as np
import pytest

if os.environ.get("ORBITKV_REQUIRE") != "vllm":
    pytest.importorskip("vllm", reason="vLLM is not installed here (make test-vllm033 runs this in its vLLM environment)")
pytest.importorskip("vllm.v1.kv_offload.tiering.base", reason="this vLLM has no secondary-tier interface (0.33 has)")

from vllm.v1.kv_offload.base import LookupResult, ReqContext  # noqa: E402
from vllm.v1.kv_offload.tiering.base import SecondaryTierManager  # noqa: E402

from orbitkv.vllm_tier import OrbitKVTier  # noqa: E402
from tests.fixtures import real_peer_handle, start_real_peer, stop_real_peer  # noqa: E402
from tests.vtier_harness import ABANDON_S, BOUND_S, END, FAST, Engine, keys_for, row_bytes, tier_entry  # noqa: E402

HIT, MISS = LookupResult.HIT, LookupResult.MISS


@pytest.fixture
def engines():
    made = []

    def make(socket, wait=True, **kw):
        """An engine; ``wait``: once its tier's sessions are open (they open in
        the background: until then lookups miss and stores are dropped)."""
        config = {k: kw.pop(k) for k in ("model", "dtype", "chunks", "engine_id") if k in kw}
        e = Engine(tier_entry(socket, **kw), **config)
        made.append(e)
        if wait:
            _until(lambda: _ready(e))
        return e

    yield make
    for e in made:
        e.close()


def _exact(engine, keys, ctx):
    rows = engine.read(keys, ctx)
    return all(np.array_equal(r, row_bytes(k)) for k, r in zip(keys, rows))


# --- the contract ----------------------------------------------------------------


def test_vllm_loads_the_tier_by_module_path_and_every_abstract_method_is_implemented(real_peer, engines):
    e = engines(real_peer.socket)
    assert isinstance(e.tier, OrbitKVTier) and isinstance(e.tier, SecondaryTierManager)
    assert not OrbitKVTier.__abstractmethods__
    assert e.tier.block_size_bytes == e.pool.shape[1]
    assert e.tier.mode == "zero-copy stores"  # vLLM's pool is a /dev/shm file the peer maps


def test_shutdown_lets_vllm_unmap_its_pool(real_peer, caplog):
    """The tier drops every view of vLLM's pool when it shuts down: vLLM then
    unmaps it instead of keeping it mapped for an exporter it cannot name."""
    import logging

    caplog.set_level(logging.INFO)
    e = Engine(tier_entry(real_peer.socket))
    _until(lambda: _ready(e))
    e.store(keys_for(17, 2))
    e.settle(BOUND_S)
    e.close()
    assert not [r for r in caplog.records if "still exported" in r.getMessage()]


def test_unknown_option_is_refused_at_start(real_peer):
    with pytest.raises(ValueError, match="unknown option"):
        Engine(tier_entry(real_peer.socket, sokcet="typo"))


# --- sharing between engines --------------------------------------------------------------


MODES = {"auto": "zero-copy stores", "on": "zero-copy", "off": "staging"}


@pytest.mark.parametrize("zero_copy", sorted(MODES))
def test_one_engine_stores_another_loads_byte_exact(real_peer, engines, zero_copy):
    a = engines(real_peer.socket, zero_copy=zero_copy)
    b = engines(real_peer.socket, zero_copy=zero_copy)
    assert a.tier.mode == MODES[zero_copy]
    ks = keys_for(1, 12)
    assert a.store(ks) == ks
    a.settle(BOUND_S)
    answers, ctx = b.lookup(ks, BOUND_S)
    assert answers == [HIT] * len(ks)
    assert _exact(b, ks, ctx)
    b.finish(ctx)
    # the loading engine's own pool now answers, the peer is not asked again
    again, ctx2 = b.lookup(ks, BOUND_S)
    assert again == [HIT] * len(ks)
    b.finish(ctx2)


def test_zero_copy_and_staging_engines_share_pages(real_peer, engines):
    a = engines(real_peer.socket, zero_copy="off")
    b = engines(real_peer.socket)
    ks = keys_for(2, 5)
    a.store(ks)
    a.settle(BOUND_S)
    answers, ctx = b.lookup(ks, BOUND_S)
    assert answers == [HIT] * 5 and _exact(b, ks, ctx)


def test_a_peer_that_cannot_map_vllms_pool_gets_staged_stores(real_peer, engines, caplog, capfd):
    """vLLM names its pool file after the engine id; an id that puts the file in
    the peer's data dir (which the peer refuses to map: its own files live
    there) stands in for a peer that cannot open the engine's /dev/shm. The
    tier falls back to staging its stores too, and pages still flow."""
    hop = f"/dev/shm/vllm_offload_okvt-{os.getpid()}"
    os.makedirs(hop, exist_ok=True)
    try:
        up = os.path.relpath(real_peer.data_dir, hop)  # from that directory into the data dir
        a = engines(real_peer.socket, engine_id=f"okvt-{os.getpid()}/{up}/pool")
        assert a.tier.mode == "staging"
        # the peer said no (logged by the worker process, or by the thread worker)
        said = [r.getMessage() for r in caplog.records] + [capfd.readouterr().err]
        assert any("cannot map vLLM's CPU pool" in m for m in said)
        b = engines(real_peer.socket)
        ks = keys_for(18, 3)
        a.store(ks)
        a.settle(BOUND_S)
        answers, ctx = b.lookup(ks, BOUND_S)
        assert answers == [HIT] * 3 and _exact(b, ks, ctx)
    finally:
        os.rmdir(hop)


def test_a_refusal_logged_by_the_thread_worker_lets_vllm_unmap_its_pool(real_peer, caplog):
    """The thread worker logs the peer's refusal of a session over vLLM's pool
    with the refusal itself as an argument. A handler that keeps records
    (caplog here, a MemoryHandler in a server) keeps that object alive; it must
    hold no view of vLLM's pool (a traceback's frames would), or vLLM could not
    unmap its pool at shutdown."""
    import logging

    caplog.set_level(logging.INFO)
    hop = f"/dev/shm/vllm_offload_okvr-{os.getpid()}"
    os.makedirs(hop, exist_ok=True)
    try:
        up = os.path.relpath(real_peer.data_dir, hop)
        e = Engine(tier_entry(real_peer.socket, worker="thread"), engine_id=f"okvr-{os.getpid()}/{up}/pool")
        _until(lambda: _ready(e))
        assert e.tier.mode == "staging"
        assert any("cannot map vLLM's CPU pool" in r.getMessage() for r in caplog.records)
        e.close()
        assert not [r for r in caplog.records if "still exported" in r.getMessage()]
    finally:
        os.rmdir(hop)


def test_another_format_never_sees_the_pages(real_peer, engines):
    a = engines(real_peer.socket)
    other_dtype = engines(real_peer.socket, dtype="float16")
    other_model = engines(real_peer.socket, model="orbitkv/other")
    ks = keys_for(3, 4)
    a.store(ks)
    a.settle(BOUND_S)
    for e in (other_dtype, other_model):
        answers, _ = e.lookup(ks, BOUND_S)
        assert answers == [MISS] * 4


def test_a_miss_after_the_first_gap_and_hits_after_it(real_peer, engines):
    """The peer answers a run of keys with its leading hits; the tier resolves
    the keys after a gap too (vLLM's sliding-window lookups ask them)."""
    a, b = engines(real_peer.socket), engines(real_peer.socket)
    ks = keys_for(4, 6)
    a.store(ks[:2] + ks[3:])
    a.settle(BOUND_S)
    answers, ctx = b.lookup(ks, BOUND_S)
    assert answers == [HIT, HIT, MISS, HIT, HIT, HIT]
    assert _exact(b, ks[:2] + ks[3:], ctx)


# --- failures are misses ---------------------------------------------------------------


def test_peer_down_at_start_then_up(tmpdir_short, engines):
    peer = real_peer_handle(tmpdir_short)
    a = engines(peer.socket, wait=False, **FAST)
    ks = keys_for(5, 4)
    a.store(ks)
    a.settle(BOUND_S)  # the cascade fails at once: nothing to wait for
    answers, _ = engines(peer.socket, wait=False, **FAST).lookup(ks, BOUND_S)
    assert answers == [MISS] * 4
    peer.start()
    try:
        b = engines(peer.socket, **FAST)
        ks2 = keys_for(6, 3)
        _wait_stored(a, ks2)
        _until(lambda: _ready(b))
        answers, ctx = b.lookup(ks2, BOUND_S)
        assert answers == [HIT] * 3 and _exact(b, ks2, ctx)
    finally:
        peer.stop()


def _ready(engine):
    return engine.tier._link.ready


def _wait_stored(engine, keys):
    """Stores keys once the tier's session is open (it opens in the background
    once the peer is up)."""
    deadline = time.monotonic() + BOUND_S
    while time.monotonic() < deadline:
        if _ready(engine):
            engine.store(keys)
            engine.settle(BOUND_S)
            return
        time.sleep(0.02)
    raise AssertionError("the tier's session did not open")


def test_peer_killed_and_restarted_mid_store(tmpdir_short, engines):
    peer = start_real_peer(tmpdir_short)
    try:
        a, b = engines(peer.socket, **FAST), engines(peer.socket, **FAST)
        ks = keys_for(7, 40)
        for i in range(0, 40, 4):
            a.store(ks[i:i + 4])
        peer.stop(signal.SIGKILL)  # jobs in flight, queued and not yet sent
        a.settle(BOUND_S)
        answers, ctx = b.lookup(ks, BOUND_S)  # peer down: misses, no error
        assert set(answers) <= {HIT, MISS}
        b.finish(ctx)
        peer.start()
        ks2 = keys_for(8, 6)
        _wait_stored(a, ks2)
        _until(lambda: _ready(b))
        answers, ctx = b.lookup(ks2, BOUND_S)
        assert answers == [HIT] * 6 and _exact(b, ks2, ctx)
    finally:
        peer.stop()


def test_peer_frozen_mid_store_ends_staged_jobs_by_their_deadline(tmpdir_short, engines):
    """Staged stores to a frozen peer fail at their abandon time (nothing waits);
    their staging slots stay out of use until the peer answers again."""
    peer = start_real_peer(tmpdir_short)
    try:
        a = engines(peer.socket, zero_copy="off", **FAST)
        a.store(keys_for(9, 2))
        a.settle(BOUND_S)
        peer.proc.send_signal(signal.SIGSTOP)
        try:
            a.store(keys_for(10, 4))
            a.settle(BOUND_S)  # ends while the peer is still stopped: nothing waited for it
            assert a.tier._link.unsettled() == 1  # its slots wait for the peer
        finally:
            peer.proc.send_signal(signal.SIGCONT)
        _until(lambda: a.tier._link.unsettled() == 0)
        ks = keys_for(15, 2)
        a.store(ks)
        a.settle(BOUND_S)
        answers, ctx = engines(peer.socket).lookup(ks, BOUND_S)
        assert answers == [HIT, HIT]
    finally:
        peer.stop()


def test_peer_frozen_mid_store_holds_pool_rows_until_it_answers(tmpdir_short, engines):
    """A store the peer reads from vLLM's pool in place, sent to a frozen peer:
    its rows stay pinned past the abandon time (the peer, woken, may still copy
    them), and the job ends once the peer answers again and the operation's
    deadline has passed since."""
    peer = start_real_peer(tmpdir_short)
    try:
        a = engines(peer.socket, **FAST)
        assert a.tier.mode == "zero-copy stores"
        peer.proc.send_signal(signal.SIGSTOP)
        try:
            a.store(keys_for(16, 3))
            deadline = time.monotonic() + ABANDON_S + 1.0
            while time.monotonic() < deadline:  # held throughout, however often vLLM steps
                a.step()
                assert not a.idle()
                time.sleep(0.05)
        finally:
            peer.proc.send_signal(signal.SIGCONT)
        a.settle(BOUND_S)  # the job ends once the peer answers again
    finally:
        peer.stop()


def test_peer_killed_and_restarted_mid_load(tmpdir_short, engines):
    """The peer freezes once the lookups found the pages and before the
    promotion is sent, then is killed and restarted: the promotion fails, the
    request sees misses (never an error or a hang); pages saved to SSD are
    found again after the restart, byte for byte."""
    peer = start_real_peer(tmpdir_short)
    try:
        a, b = engines(peer.socket, durability="ssd", **FAST), engines(peer.socket, **FAST)
        ks = keys_for(11, 6)
        a.store(ks)
        a.settle(BOUND_S)
        m, tier = b.manager, b.tier
        ctx = ReqContext("mid-load")
        with m.lock:
            m.on_new_request(ctx)
            [m.lookup(k, ctx) for k in ks]  # RETRY: probes queued
            tier.on_schedule_end(END)  # the probes go out (not the manager's step: no promotion yet)
        # the answers are in: each lookup now reserves a CPU row for its promotion
        _until(lambda: _answers(b, ks, ctx, step=False) == ["hit_pending"] * len(ks))
        peer.proc.send_signal(signal.SIGSTOP)
        b.step()  # the promotion is submitted to a frozen peer
        peer.stop(signal.SIGKILL)
        peer.start()
        b.settle(BOUND_S)
        answers = _answers(b, ks, ctx)
        assert answers == ["miss"] * len(ks)  # the failed promotion is a miss, not asked again
        b.finish(ctx)
        answers, ctx2 = engines(peer.socket, **FAST).lookup(ks, BOUND_S)
        assert answers == [HIT] * 6
    finally:
        peer.stop()


def _answers(engine, keys, ctx, step=True):
    m = engine.manager
    with m.lock:
        out = [m.lookup(k, ctx) for k in keys]
        if step:
            m.on_schedule_end(END)
    return [a.name.lower() for a in out]


def _until(pred, timeout=BOUND_S):
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.005)


def test_a_full_peer_drops_stores_without_errors(tmpdir_short, engines):
    """A peer with room for a handful of rows and no SSD: every store ends,
    lookups answer hit or miss, and whatever hits is byte-exact."""
    peer = start_real_peer(tmpdir_short, "--dram-bytes", "64KiB", "--dram-slab-bytes", "16KiB", "--ssd-bytes", "0")
    try:
        a, b = engines(peer.socket, chunks=128), engines(peer.socket, chunks=128)
        ks = keys_for(12, 64)
        for i in range(0, 64, 8):
            a.store(ks[i:i + 8])
        a.settle(BOUND_S)
        answers, ctx = b.lookup(ks, BOUND_S)
        hits = [k for k, r in zip(ks, answers) if r is HIT]
        assert len(hits) < len(ks)
        assert _exact(b, hits, ctx)
    finally:
        peer.stop()


@pytest.mark.parametrize("request_level", [False, True])
def test_a_prefix_hot_in_vllms_pool_stays_in_the_peer(tmpdir_short, engines, request_level):
    """vLLM cascades a chunk to its secondary tiers only when it first stores
    it, and a hit in its CPU pool never reaches them. Reproduced (the 8 GiB
    peer of the H100 run, 2026-12-06): a prefix every request hits in vLLM's
    pool, while single-use chunks stream past, ages out of a small peer.
    With request_level (the default) vLLM also stores the request's pool hits
    to the tier, the peer sees the prefix used on every request and keeps it."""
    peer = start_real_peer(tmpdir_short, "--dram-bytes", "1MiB", "--dram-slab-bytes", "256KiB", "--ssd-bytes", "0")
    try:
        a = engines(peer.socket, chunks=64, request_level=request_level)
        prefix = keys_for(21, 8)
        a.store(prefix)
        a.settle(BOUND_S)
        for r in range(24):  # 24 requests of the prefix + 16 chunks of their own: 384 chunks, 3 MiB
            answers, ctx = a.lookup(prefix, BOUND_S)
            assert answers == [HIT] * len(prefix) and _exact(a, prefix, ctx)  # a hit in vLLM's pool
            a.finish(ctx)
            a.store(prefix + keys_for(100 + r, 16))
            a.settle(BOUND_S)
        b = engines(peer.socket)  # a fresh engine: only the peer can have the prefix
        answers, ctx = b.lookup(prefix, BOUND_S)
        if request_level:
            assert answers == [HIT] * len(prefix) and _exact(b, prefix, ctx)
        else:
            assert answers[0] is MISS, "the prefix outlived 3 MiB of single-use chunks in a 1 MiB peer"
    finally:
        stop_real_peer(peer)


def test_request_level_only_with_zero_copy_stores(real_peer, engines):
    """A staged store copies its rows into the staging region before the peer
    can say it holds them: re-storing every hit of every request would copy
    them all, so with staged stores the tier stays chunk level."""
    from vllm.v1.kv_offload.base import OffloadPolicy

    policy = lambda e: e.tier.on_new_request(ReqContext("p")).policy  # noqa: E731
    assert policy(engines(real_peer.socket)) is OffloadPolicy.REQUEST_LEVEL
    assert policy(engines(real_peer.socket, zero_copy="off")) is OffloadPolicy.CHUNK_LEVEL
    assert policy(engines(real_peer.socket, request_level=False)) is OffloadPolicy.CHUNK_LEVEL


def test_a_job_larger_than_the_staging_region_goes_in_parts(real_peer, engines):
    a = engines(real_peer.socket, zero_copy="off", staging_chunks=2)
    b = engines(real_peer.socket, staging_chunks=2)
    ks = keys_for(13, 5)
    a.store(ks)  # one job of five rows through two slots
    a.settle(BOUND_S)
    answers, ctx = b.lookup(ks, BOUND_S)  # one promotion of five rows through two slots
    assert answers == [HIT] * 5 and _exact(b, ks, ctx)


def test_lookups_race_stores(real_peer, engines):
    """One engine stores while another looks the same keys up: every answer is
    hit or miss, every hit byte-exact, and once the stores end all hit."""
    a, b = engines(real_peer.socket, chunks=256), engines(real_peer.socket, chunks=256)
    ks = keys_for(14, 96)
    errors: list = []

    def writer():
        try:
            for i in range(0, len(ks), 4):
                a.store(ks[i:i + 4])
                a.step()
        except Exception as e:  # surfaced below
            errors.append(e)

    t = threading.Thread(target=writer)
    t.start()
    try:
        for _ in range(6):
            answers, ctx = b.lookup(ks, BOUND_S)
            hits = [k for k, r in zip(ks, answers) if r is HIT]
            assert _exact(b, hits, ctx)
            b.finish(ctx)
    finally:
        t.join(BOUND_S)
    assert not errors and not t.is_alive()
    a.settle(BOUND_S)
    answers, ctx = engines(real_peer.socket, chunks=256).lookup(ks, BOUND_S)
    assert answers == [HIT] * len(ks)


def test_readme_tier_config_is_what_vllm_resolves():
    """The README line's --kv-transfer-config is a valid vLLM KVTransferConfig, and
    vLLM's own factories resolve its spec and its secondary tier to OrbitKVTier."""
    import json

    from vllm.config import KVTransferConfig
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

    from tests.test_vllm_tier_parts import readme_tier_line

    argv = readme_tier_line()
    kv = KVTransferConfig(**json.loads(argv[argv.index("--kv-transfer-config") + 1]))
    extra = dict(kv.kv_connector_extra_config, cpu_bytes_to_use=1 << 30)  # what --kv-offloading-size adds
    assert OffloadingSpecFactory.get_spec_cls(extra) is TieringOffloadingSpec
    ((_, cls),) = TieringOffloadingSpec._get_secondary_tiers(extra)
    assert cls is OrbitKVTier
