"""Checks only the real Go peer can answer: its metrics, gauges draining to
zero, SSD durability, and a lease taken by one session (the vLLM scheduler's
control session) used by another (a worker's) for a Load."""

import time

import pytest
import torch

from orbitkv import buffers, errors, keys
from orbitkv.client import Client, ControlSession, Durability, PageRef
from tests.shm import flash_layers, pool_bytes, shm_pool

L, NB, BS, H, D, PT = 2, 16, 4, 2, 8, 8


def _layout():
    return keys.Layout("orbitkv/real", "r0", "fp32", L, H, D, 0, 1, PT, "vllm-flash")


def _wait_for(pred, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return pred()


@pytest.fixture
def worker(real_peer):
    with shm_pool(pool_bytes(L, NB, BS, H, D)) as (path, pool):
        pool.copy_(torch.randint(0, 255, pool.shape, dtype=torch.uint8))
        desc = buffers.describe_planes(buffers.vllm_planes(flash_layers(pool, L, NB, BS, H, D)))
        c = Client(real_peer.socket)
        s = c.open_session(_layout(), block_tokens=BS, num_blocks=NB, buffers=desc.buffers, segments=desc.segments)
        yield real_peer, c, s
        c.close()


def test_metrics_count_pages_and_gauges_drain(worker):
    peer, c, s = worker
    ks = keys.chain(s.layout.fingerprint(), PT, list(range(4 * PT)))
    assert s.save([PageRef(k, (2 * i, 2 * i + 1)) for i, k in enumerate(ks)]).wait(10).ok
    m = peer.metrics()
    assert m["orbitkv_fabric_saved_pages_total"] == 4
    lk = s.lookup(ks + [b"\x07" * 16], lease=True)
    assert lk.hit_pages == 4
    m = peer.metrics()
    assert m["orbitkv_fabric_lookup_hit_pages_total"] == 4
    assert m["orbitkv_fabric_leases"] == 1 and m["orbitkv_fabric_query_bytes"] > 0
    assert s.load([PageRef(k, (8 + i * 2, 9 + i * 2)) for i, k in enumerate(ks[:2])], lease_id=lk.lease_id).wait(10).ok
    m = peer.metrics()
    assert m['orbitkv_fabric_loaded_pages_total{tier="dram"}'] == 2
    assert m["orbitkv_fabric_loaded_tokens_total"] == 2 * PT
    s.release(lk.lease_id)
    c.close()
    assert _wait_for(lambda: all(
        peer.metrics().get(g, 0) == 0
        for g in ("orbitkv_fabric_leases", "orbitkv_fabric_query_bytes", "orbitkv_fabric_sessions",
                  "orbitkv_transfer_inflight_ops", "orbitkv_tiers_ssd_inflight")
    )), peer.metrics()


def test_ssd_durability_save(worker):
    peer, c, s = worker
    ks = keys.chain(s.layout.fingerprint(), PT, list(range(50, 50 + 2 * PT)))
    res = s.save([PageRef(ks[0], (0, 1)), PageRef(ks[1], (2, 3))], durability=Durability.SSD).wait(20)
    assert res.ok, res
    assert s.lookup(ks).hit_pages == 2


def test_lease_from_control_session_usable_by_worker(worker):
    peer, c, s = worker
    ks = keys.chain(s.layout.fingerprint(), PT, list(range(900, 900 + PT)))
    assert s.save([PageRef(ks[0], (0, 1))]).wait(10).ok
    ctl = ControlSession(c, _layout(), BS)
    try:
        lk = ctl.lookup(ks, lease=True)
        assert lk.hit_pages == 1 and lk.lease_id
        res = s.load([PageRef(ks[0], (4, 5))], lease_id=lk.lease_id).wait(10)
        assert res.ok, res
        ctl.release(lk.lease_id)
    finally:
        ctl.close()


def test_load_refuses_unknown_and_other_model_leases(worker):
    """The peer checks a Load's lease: a garbage id is NotFound, another model's lease
    FailedPrecondition (both of which the vLLM worker answers by loading without it)."""
    peer, c, s = worker
    ks = keys.chain(s.layout.fingerprint(), PT, list(range(700, 700 + PT)))
    assert s.save([PageRef(ks[0], (0, 1))]).wait(10).ok
    with pytest.raises(errors.NotFound, match="lease"):
        s.load([PageRef(ks[0], (4, 5))], lease_id="l-garbage")
    other = ControlSession(c, keys.Layout("orbitkv/other", "r0", "fp32", L, H, D, 0, 1, PT, "vllm-flash"), BS)
    try:
        lk = other.lookup(ks, lease=True)
        assert lk.lease_id
        with pytest.raises(errors.FailedPrecondition, match="lease"):
            s.load([PageRef(ks[0], (4, 5))], lease_id=lk.lease_id)
        assert s.load([PageRef(ks[0], (4, 5))]).wait(10).ok
        other.release(lk.lease_id)
    finally:
        other.close()


def test_control_session_declares_recompute_rate(worker):
    """A scheduler session that declares its engine's prefill rate opens and looks up as usual:
    with no SSD read measured yet the peer restores whatever it holds (the cut itself is
    tested in Go: fabric TestLookupLeavesSlowSSDToRecompute)."""
    peer, c, s = worker
    ks = keys.chain(s.layout.fingerprint(), PT, list(range(700, 700 + 2 * PT)))
    assert s.save([PageRef(ks[0], (0, 1)), PageRef(ks[1], (2, 3))]).wait(10).ok
    ctl = ControlSession(c, _layout(), BS, recompute_tokens_per_s=25000)
    try:
        lk = ctl.lookup(ks)
        assert lk.hit_pages == 2 and lk.dram == 2
    finally:
        ctl.close()


def test_waiting_save_and_load_answer_with_their_results(worker):
    """save/load(wait=True): one call each; the Op already holds the finished result."""
    peer, c, s = worker
    ks = keys.chain(s.layout.fingerprint(), PT, list(range(500, 500 + 2 * PT)))
    op = s.save([PageRef(ks[0], (0, 1)), PageRef(ks[1], (2, 3))], wait=True)
    assert op._result is not None and op._result.done and op._result.ok
    assert op.wait(0).ok  # no Wait call needed (and the peer forgot the op)
    op = s.load([PageRef(ks[0], (6, 7)), PageRef(ks[1], (8, 9))], wait=True)
    res = op.wait(0)
    assert op._result is not None and res.ok and len(res.pages) == 2
