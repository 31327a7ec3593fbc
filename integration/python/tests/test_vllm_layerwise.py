"""Layer-wise loads in the vLLM worker half, with the fake peer and fake
CUDA events: one layer-wise Load per step, GPU-side waits per layer, load
errors still reported per block, and the whole-request path where the
session has no layer events."""

import dataclasses
import enum
import types

import pytest
import torch

from orbitkv.vllm import OrbitKVConnector
from orbitkv.vllm import worker as worker_mod
from tests.fakepeer import FakePeer
from tests.shm import flash_layers, pool_bytes, shm_pool
from tests.test_vllm_connector import BS, D, H, L, NB, PT, Engine, _compute_and_save, _extra
from tests.vllm_fakes import NewRequestData, Request, SchedulerOutput


class LayerwiseEngine(Engine):
    # a step whose attention layers call the hooks, as vLLM's piecewise and eager steps do
    forward_context = types.SimpleNamespace(attn_metadata={"layer": "metadata"}, cudagraph_runtime_mode=None)

    def __init__(self, socket, kv):
        super().__init__(socket, kv, extra=dict(_extra(socket), layerwise=True))


@pytest.fixture
def fake_cuda(monkeypatch):
    waits = []
    monkeypatch.setattr(worker_mod, "_open_events", lambda dev, hs: [("ev", h[0] - 1) for h in hs])
    monkeypatch.setattr(worker_mod, "_stream_wait", lambda dev, ev: waits.append(ev))
    monkeypatch.setattr(worker_mod, "_record_event", lambda dev: _Recorded())
    return waits


class _Recorded:
    """Stands in for a CUDA event recorded after the step's KV writes."""

    synced = 0

    def synchronize(self):
        _Recorded.synced += 1


def _engine(tmp_path, with_events, fake_cuda):
    fp = FakePeer(str(tmp_path / "fake.sock"))
    fp.layer_events = with_events
    ctx = shm_pool(pool_bytes(L, NB, BS, H, D))
    path, pool = ctx.__enter__()
    e = LayerwiseEngine(fp.socket, flash_layers(pool, L, NB, BS, H, D))
    w = e.work.worker
    w._device = "cuda:0"  # the planes are CPU shared memory here; pretend they are on a GPU
    w._events_gen = -1
    w._refresh_events()

    def close():
        e.close()
        fp.stop()
        ctx.__exit__(None, None, None)

    return e, fp, close


def _restore_step(e, name, tokens, blocks, layers_forward=True):
    n, is_async = e.sched.get_num_new_matched_tokens(Request(name, tokens), 0)
    assert is_async is False, "layer-wise loads run inside the step"
    e.sched.update_state_after_alloc(Request(name, tokens), (blocks,), n)
    so = SchedulerOutput([NewRequestData(name, tokens, (blocks,), n)], num_scheduled_tokens={name: len(tokens) - n})

    def forward():
        if layers_forward:
            for layer in e.kv:
                e.work.wait_for_layer_load(layer)

    return n, e.step(so, before_save=forward)


def test_layerwise_restore_waits_per_layer_on_the_gpu(tmp_path, fake_cuda):
    e, fp, close = _engine(tmp_path, True, fake_cuda)
    try:
        assert e.work.worker.layerwise
        a = Request("a", list(range(3 * PT + 1)))
        synced = _Recorded.synced
        _compute_and_save(e, a, list(range(0, 7)))
        assert _Recorded.synced > synced, "a GPU save waits for the step's KV writes first"
        tokens = a.prompt_token_ids[: 3 * PT] + [9, 9, 9]
        b_blocks = list(range(10, 17))
        n, (meta, res, errs) = _restore_step(e, "b", tokens, b_blocks)
        assert n == 3 * PT and len(meta.loads) == 1 and meta.loads[0].sync
        assert fp.layerwise_loads == [3], "one layer-wise Load for the step"
        assert fake_cuda == [("ev", l) for l in range(L)], "one GPU-side wait per layer, in order"
        assert not errs and not (res.failed_recving or set())
        assert e.blocks_bytes(b_blocks[:3]) == e.blocks_bytes(list(range(0, 3)))
    finally:
        close()


def test_layerwise_load_errors_reported_per_block(tmp_path, fake_cuda):
    e, fp, close = _engine(tmp_path, True, fake_cuda)
    try:
        a = Request("a", list(range(3 * PT + 1)))
        _compute_and_save(e, a, list(range(0, 7)))
        ks = sorted(fp.store)
        fp.corrupt.update(ks)  # every page fails at the peer
        tokens = a.prompt_token_ids[: 3 * PT] + [7]
        b_blocks = list(range(20, 27))
        _, (meta, res, errs) = _restore_step(e, "b", tokens, b_blocks)
        assert len(meta.loads) == 1
        assert errs == set(b_blocks[:6]), "every block of the failed pages"
        assert not (res.failed_recving or set())  # per block only (connector.get_transfer_results)
    finally:
        close()


def test_failed_layerwise_call_waits_on_nothing(tmp_path, fake_cuda):
    e, fp, close = _engine(tmp_path, True, fake_cuda)
    try:
        a = Request("a", list(range(2 * PT + 1)))
        _compute_and_save(e, a, list(range(0, 5)))
        fp.restart()  # the peer forgets the session: the Load is answered NotFound, then reopened
        fp.layer_events = False  # ...without layer events: the layer-wise Load is refused
        tokens = a.prompt_token_ids[: 2 * PT] + [5]
        _, (meta, res, errs) = _restore_step(e, "b", tokens, list(range(30, 35)))
        if meta.loads:
            assert fake_cuda == [], "no event waited on without an enqueued load"
            assert errs == set(range(30, 34))
    finally:
        close()


def test_without_layer_events_loads_are_whole_request(tmp_path, fake_cuda):
    e, fp, close = _engine(tmp_path, False, fake_cuda)
    try:
        assert not e.work.worker.layerwise
        a = Request("a", list(range(2 * PT + 1)))
        _compute_and_save(e, a, list(range(0, 5)))
        tokens = a.prompt_token_ids[: 2 * PT] + [5]
        b_blocks = list(range(10, 15))
        _, (meta, res, errs) = _restore_step(e, "b", tokens, b_blocks)
        assert len(meta.loads) == 1 and fp.layerwise_loads == [] and fake_cuda == []
        assert not errs
        assert e.blocks_bytes(b_blocks[:4]) == e.blocks_bytes(list(range(0, 4)))
    finally:
        close()


class _GraphMode(enum.Enum):  # vLLM's CUDAGraphMode runtime values (vllm.config.CUDAGraphMode)
    NONE = 0
    PIECEWISE = 1
    FULL = 2


_META = {"layer": "metadata"}


@pytest.mark.parametrize("ctx,hooks_run", [
    (types.SimpleNamespace(attn_metadata=_META, cudagraph_runtime_mode=_GraphMode.FULL), False),  # V1, full graph
    (types.SimpleNamespace(attn_metadata=None, cudagraph_runtime_mode=_GraphMode.NONE), False),  # V2 before a full graph
    (None, False),
    (types.SimpleNamespace(attn_metadata=_META, cudagraph_runtime_mode=_GraphMode.PIECEWISE), True),
    (types.SimpleNamespace(attn_metadata=_META, cudagraph_runtime_mode=_GraphMode.NONE), True),
], ids=["v1-full", "v2-full", "no-context", "piecewise", "eager"])
def test_a_full_graph_step_waits_for_every_layer_before_it_starts(tmp_path, fake_cuda, ctx, hooks_run):
    """vLLM keeps full CUDA graphs for decode-only batches; such a step calls no
    wait_for_layer_load, so its layer-wise load must make the stream wait for
    every layer in start_load_kv. Piecewise and eager steps wait per layer."""
    e, fp, close = _engine(tmp_path, True, fake_cuda)
    try:
        e.forward_context = ctx
        mode = _GraphMode.FULL if not hooks_run else None
        a = Request("a", list(range(3 * PT + 1)))
        _compute_and_save(e, a, list(range(0, 7)))
        tokens = a.prompt_token_ids[: 3 * PT] + [9]
        b_blocks = list(range(10, 17))
        n, (meta, res, errs) = _restore_step(e, "b", tokens, b_blocks, layers_forward=False)
        waits_at_start = list(fake_cuda)
        assert n == 3 * PT and len(meta.loads) == 1 and fp.layerwise_loads == [3]
        if mode is _GraphMode.FULL:
            assert waits_at_start == [("ev", l) for l in range(L)], "every layer waited on before the graph"
            for layer in e.kv:  # were a hook to run after all, it adds no second wait
                e.work.wait_for_layer_load(layer)
            assert fake_cuda == waits_at_start
        else:
            assert waits_at_start == [], "per-layer waits are the attention hooks' (none ran here)"
        assert not errs and e.blocks_bytes(b_blocks[:3]) == e.blocks_bytes(list(range(0, 3)))
    finally:
        close()


def test_layerwise_keeps_full_graphs_unless_asked_for_piecewise():
    assert not OrbitKVConnector.requires_piecewise_for_cudagraph({"layerwise": True})
    assert OrbitKVConnector.requires_piecewise_for_cudagraph({"layerwise": True, "layerwise_piecewise": True})
    assert not OrbitKVConnector.requires_piecewise_for_cudagraph({"layerwise_piecewise": True})
    assert not OrbitKVConnector.requires_piecewise_for_cudagraph(None)


def test_a_session_reopened_by_the_load_is_waited_on_with_its_own_events(tmp_path, fake_cuda, monkeypatch):
    """The peer forgot the session; the layer-wise Load reopens it and runs there. The
    layers must wait on the new session's events, not on the old ones (never recorded
    for this load, so a wait on them would not wait at all)."""
    monkeypatch.setattr(worker_mod, "_open_events", lambda dev, hs: [("ev", h[0] - 1, h[1]) for h in hs])
    e, fp, close = _engine(tmp_path, True, fake_cuda)
    try:
        a = Request("a", list(range(2 * PT + 1)))
        _compute_and_save(e, a, list(range(0, 5)))
        old = {ev[2] for ev in e.work.worker._events}
        fp.restart()
        tokens = a.prompt_token_ids[: 2 * PT] + [5]
        b_blocks = list(range(10, 15))
        _, (meta, res, errs) = _restore_step(e, "b", tokens, b_blocks)
        assert len(meta.loads) == 1 and fp.layerwise_loads == [2]
        new = {ev[2] for ev in fake_cuda}
        assert len(fake_cuda) == L and new and not (new & old), (old, fake_cuda)
        assert not errs and e.blocks_bytes(b_blocks[:2]) == e.blocks_bytes(list(range(0, 2)))
    finally:
        close()


@pytest.mark.parametrize("fenced", [False, True], ids=["producer", "vllm-fences"])
@pytest.mark.parametrize("with_events", [True, False], ids=["layer-wise", "whole-request"])
def test_a_restore_reaches_the_peer_only_after_the_engines_earlier_kernels(tmp_path, fake_cuda, monkeypatch,
                                                                           with_events, fenced):
    """The peer copies on its own stream, unordered with the engine's: under vLLM's async
    scheduling the previous step may still be writing blocks a preemption just handed to
    this restore. The Load must reach the peer only once an event recorded on the engine's
    stream at start_load_kv has been waited for — unless vLLM fences such blocks itself
    (consumer roles, vLLM 0.26: _compat.engine_fences_loads), when the restore skips it."""
    e, fp, close = _engine(tmp_path, with_events, fake_cuda)
    w = e.work.worker
    w.cfg = dataclasses.replace(w.cfg, engine_fences_loads=fenced)
    try:
        a = Request("a", list(range(2 * PT + 1)))
        _compute_and_save(e, a, list(range(0, 5)))
        loads_before = fp.calls.get("Load", 0)
        seen = []  # per wait on an engine event: how many Loads the peer had received by then

        class Ordered:
            def synchronize(self):
                seen.append(fp.calls.get("Load", 0))

        monkeypatch.setattr(worker_mod, "_record_event", lambda dev: Ordered())
        tokens = a.prompt_token_ids[: 2 * PT] + [5]
        b_blocks = list(range(10, 15))
        _, (meta, res, errs) = _restore_step(e, "b", tokens, b_blocks)
        assert len(meta.loads) == 1 and fp.calls.get("Load", 0) == loads_before + 1
        if fenced:
            assert all(n > loads_before for n in seen), f"no wait before the Load: {seen}"
        else:
            assert seen and seen[0] == loads_before, f"the engine's event was waited for before the Load: {seen}"
        assert not errs and e.blocks_bytes(b_blocks[:2]) == e.blocks_bytes(list(range(0, 2)))
    finally:
        close()


def test_vllm_fences_restores_for_consumer_roles_from_0_26_without_a_drafter():
    from orbitkv.vllm._compat import engine_fences_loads

    def cfg(consumer=True, spec=None):
        return types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(is_kv_consumer=consumer),
                                     speculative_config=spec)

    assert engine_fences_loads(cfg(), "0.26.0")
    assert engine_fences_loads(cfg(), "0.27.1")
    assert not engine_fences_loads(cfg(consumer=False), "0.26.0"), "kv_producer: vLLM frees at once"
    assert not engine_fences_loads(cfg(spec=object()), "0.26.0"), "V2 fences before the drafter runs"
    assert not engine_fences_loads(cfg(), "0.25.1"), "not known to fence"
    assert not engine_fences_loads({"socket": "x"}) and not engine_fences_loads(None)
