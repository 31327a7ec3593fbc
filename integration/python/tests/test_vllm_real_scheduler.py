"""The connector under vLLM's own Scheduler (installed vLLM, CPU): the base
class contract, restores checked byte for byte, the seeds' restore-admission
stall, preemption, cancellation and load failures.

Skips without vLLM (the plain /usr/bin/python3 suite); `make test` runs this
file in the vLLM environment scripts/install-vllm.sh builds, with
ORBITKV_REQUIRE=vllm so a missing vLLM fails instead of skipping."""

from __future__ import annotations

import inspect
import os
import random

import pytest

if os.environ.get("ORBITKV_REQUIRE") != "vllm":
    pytest.importorskip("vllm", reason="vLLM is not installed here (make test runs this in its vLLM environment)")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorBase_V1  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from orbitkv.vllm import OrbitKVConnector  # noqa: E402
from orbitkv.vllm._compat import _at_least, vllm_version  # noqa: E402
from tests.vllm_harness import Harness  # noqa: E402


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


# --- the contract ---------------------------------------------------------------


def test_every_abstract_method_of_the_installed_base_is_implemented():
    missing = [m for m in KVConnectorBase_V1.__abstractmethods__ if m in OrbitKVConnector.__abstractmethods__]
    assert not missing and not OrbitKVConnector.__abstractmethods__, missing


def _callable_like(base_fn, ours_fn) -> str:
    """'' when ours accepts every call the base's signature allows."""
    bs, os_ = inspect.signature(base_fn), inspect.signature(ours_fn)
    args, kwargs = [], {}
    for p in bs.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind == p.KEYWORD_ONLY:
            kwargs[p.name] = object()
        else:
            args.append(object())
    try:
        os_.bind(*args, **kwargs)
        os_.bind(*args[:1], **{p.name: object() for p in list(bs.parameters.values())[1:]
                               if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)})
    except TypeError as e:
        return f"{bs} vs ours {os_}: {e}"
    return ""


def test_overridden_hooks_accept_the_base_signatures():
    checked, bad = [], {}
    for name, base_fn in inspect.getmembers(KVConnectorBase_V1, predicate=inspect.isfunction):
        ours = getattr(OrbitKVConnector, name)
        if ours is base_fn or name.startswith("__"):
            continue
        checked.append(name)
        why = _callable_like(base_fn, ours)
        if why:
            bad[name] = why
    assert not bad, bad
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta", "start_load_kv",
                 "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished",
                 "get_block_ids_with_load_errors", "request_finished", "register_kv_caches", "handle_preemptions"):
        assert name in checked, f"{name} is not overridden"


def test_steps_without_layer_hooks_are_told_apart_in_the_installed_runners(monkeypatch):
    """Layer-wise loads keep vLLM's full CUDA graphs (requires_piecewise_for_cudagraph
    False), so start_load_kv must tell from what vLLM passes it whether the attention
    layers will call wait_for_layer_load (tests/test_vllm_layerwise.py then waits for
    every layer). V1 passes its forward context (FULL on a graph replay); the V2 runner,
    0.26's default for dense models, calls start_load_kv through ActiveKVConnector.
    pre_forward, before a full graph outside any forward context, else inside the
    piecewise or eager forward's context."""
    import types

    from vllm.config import CUDAGraphMode, DeviceConfig, VllmConfig
    from vllm.forward_context import set_forward_context
    from vllm.v1.worker.gpu import kv_connector as v2

    from orbitkv.vllm.connector import _hooks_skipped

    seen = []

    class Recorder:  # the connector as V2's ActiveKVConnector drives it
        def start_load_kv(self, ctx, **kw): seen.append(_hooks_skipped(ctx))

        def __getattr__(self, name):  # every other hook: a no-op with empty results
            return lambda *a, **kw: types.SimpleNamespace(finished_sending=None, finished_recving=None,
                                                          failed_recving=set())

    monkeypatch.setattr(v2, "get_kv_transfer_group", lambda: Recorder())
    cfg = VllmConfig(device_config=DeviceConfig("cpu"))
    active = v2.ActiveKVConnector(cfg, {})
    # Layer-wise loads are sync loads (config: layerwise turns async_load off), and vLLM
    # >= 0.29 starts those before the forward only when the step says it has them.
    so = types.SimpleNamespace(kv_connector_metadata=object(), has_sync_kv_loads=True)
    active.pre_forward(so)  # V2, FULL: no forward context is set
    meta = {"model.layers.0.self_attn.attn": object()}
    for mode in (CUDAGraphMode.PIECEWISE, CUDAGraphMode.NONE):  # V2's piecewise and eager forwards
        with set_forward_context(meta, cfg, cudagraph_runtime_mode=mode):
            active.pre_forward(so)
    assert seen == [True, False, False]
    if "has_sync_kv_loads" in inspect.getsource(v2.ActiveKVConnector.pre_forward):
        # vLLM >= 0.29: a step without sync loads starts its (async) loads after the forward,
        # outside its context; their requests are not in the step, nothing waits on them.
        seen.clear()
        active.pre_forward(types.SimpleNamespace(kv_connector_metadata=object(), has_sync_kv_loads=False))
        assert seen == []
        active.post_forward(set())
        assert seen == [True]
    # V1: its forward context on a full-graph replay, and in the piecewise forward
    assert _hooks_skipped(types.SimpleNamespace(attn_metadata=meta, cudagraph_runtime_mode=CUDAGraphMode.FULL))
    assert not _hooks_skipped(types.SimpleNamespace(attn_metadata=meta, cudagraph_runtime_mode=CUDAGraphMode.PIECEWISE))
    assert not OrbitKVConnector.requires_piecewise_for_cudagraph({"layerwise": True})


def test_the_installed_vllm_fences_freed_blocks_for_the_roles_we_skip_the_wait_for():
    """OrbitKV's loads skip their wait for the engine's earlier kernels where vLLM itself
    holds freed blocks from restores until their steps end (_compat.engine_fences_loads):
    the installed Scheduler must still defer frees for consumer kv_roles, and its
    is_kv_consumer must name the roles we trust it for."""
    import types

    from vllm.config import KVTransferConfig
    from vllm.v1.core.sched.scheduler import Scheduler

    from orbitkv.vllm._compat import engine_fences_loads

    src = inspect.getsource(Scheduler.__init__)
    assert "defer_block_free" in src and "is_kv_consumer" in src and "max_concurrent_batches" in src
    for role, fenced in (("kv_both", True), ("kv_consumer", True), ("kv_producer", False)):
        kvt = KVTransferConfig(kv_connector="OrbitKVConnector", kv_role=role)
        vc = types.SimpleNamespace(kv_transfer_config=kvt, speculative_config=None)
        assert engine_fences_loads(vc) is fenced, role


def test_sleep_mode_is_declared_unsupported(real_peer):
    """Sleep mode frees and remaps the KV cache under the peer's registration. vLLM 0.33's
    base class says a connector supports it unless the connector says otherwise: ours says
    no, and the installed vLLM (where it asks) refuses --enable-sleep-mode with it."""
    assert OrbitKVConnector.supports_sleep_mode(None) is False
    if not hasattr(KVConnectorBase_V1, "supports_sleep_mode"):
        return  # vLLM 0.26: no such question
    h = Harness(real_peer.socket, num_blocks=16)
    try:
        vc = h.vllm_config
        object.__setattr__(vc.model_config, "enable_sleep_mode", True)  # no sleep mode on a CPU: set it after
        with pytest.raises(ValueError, match="does not support sleep mode"):
            vc._verify_kv_transfer_compat()
    finally:
        h.close()


def test_a_step_with_sync_loads_tells_the_runner_to_load_before_the_forward(real_peer):
    """vLLM >= 0.29 starts a step's loads after its forward unless SchedulerOutput.
    has_sync_kv_loads says the step reads KV loaded in it; every sync load the connector
    plans sets it, whatever vLLM set."""
    from vllm.v1.core.sched.output import SchedulerOutput

    prompt = _prompt(41, 300)
    _warm(real_peer.socket, {"w": prompt}, num_blocks=64)
    h = Harness(real_peer.socket, num_blocks=64, extra={"async_load": False})
    try:
        conn = h.connector
        req = h.add("R", prompt)
        n, is_async = conn.get_num_new_matched_tokens(req, 0)
        assert n == 4 * 64 and not is_async
        blocks = h.scheduler.kv_cache_manager.allocate_slots(req, len(prompt), num_external_computed_tokens=n)
        conn.update_state_after_alloc(req, blocks, n)
        so = SchedulerOutput.make_empty()
        so.has_sync_kv_loads = False  # (0.26 has no such field: the attribute is only ours then)
        meta = conn.build_connector_meta(so)
        assert meta.has_sync_loads and so.has_sync_kv_loads is True
    finally:
        h.close()


# --- restores through the real scheduler ------------------------------------------
# --- restores through the real scheduler ------------------------------------------


def _warm(socket: str, prompts: dict[str, list[int]], **kw) -> Harness:
    """Runs prompts once with the connector (their pages get saved) and waits for the saves."""
    h = Harness(socket, **kw)
    for rid, p in prompts.items():
        h.add(rid, p)
    h.run()
    assert set(h.finished) == set(prompts)
    h.close()  # joins the save threads: every save has finished
    return h


def test_a_fresh_engine_restores_a_prefix_byte_exact(real_peer):
    prompts = {"a": _prompt(1, 300), "b": _prompt(2, 700)}
    first = _warm(real_peer.socket, prompts, num_blocks=256)
    h = Harness(real_peer.socket, num_blocks=256)
    try:
        h.add("a2", prompts["a"])  # the same prompt: 4 whole pages restored, the rest computed
        h.add("b2", prompts["b"][:640] + _prompt(3, 100))  # shares 10 pages with b
        h.run()
        assert set(h.finished) == {"a2", "b2"}
        assert h.loaded_pages == 4 + 10
        assert h.checked_tokens >= 300 + 740  # every restored token was checked before it was used
        assert h.finished["a2"].tokens == first.finished["a"].tokens
    finally:
        h.close()


def test_the_hook_trace_records_a_restore_step_by_step(real_peer, tmp_path, monkeypatch):
    """ORBITKV_HOOK_TRACE (orbitkv.hooktrace): each half writes a line per
    step; the restored request's timeline runs lookup (tokens offered), load
    planned, started, reported done, then scheduled; its summary names every
    hook that ran. Unset, nothing is written."""
    prompt = _prompt(7, 300)
    _warm(real_peer.socket, {"p": prompt}, num_blocks=256)
    assert not list(tmp_path.iterdir())  # unset: no trace
    monkeypatch.setenv("ORBITKV_HOOK_TRACE", str(tmp_path / "hooks"))
    h = Harness(real_peer.socket, num_blocks=256)
    try:
        h.add("p2", prompt)
        h.run()
        assert set(h.finished) == {"p2"} and h.loaded_pages == 4
    finally:
        h.close()
    from orbitkv import hooktrace

    lines = hooktrace.read_lines(str(tmp_path / "hooks"))
    assert {d["side"] for d in lines} == {"scheduler", "worker"}
    totals = hooktrace.hook_totals(lines)
    for hook in ("scheduler.get_num_new_matched_tokens", "scheduler.build_connector_meta", "worker.start_load_kv",
                 "worker.wait_for_save"):
        assert totals[hook]["steps"] >= 1, (hook, sorted(totals))
    events = [what.split(" {")[0] for _, what in hooktrace.timelines(lines)["p2"]]
    order = ["scheduler lookups", "scheduler loads", "worker load_start", "worker recving", "scheduler scheduled"]
    at = [events.index(e) for e in order]
    assert at == sorted(at), events
    lookup = next(v for d in lines for v in d.get("lookups", []) if v["req"] == "p2" and v["tokens"])
    assert lookup["tokens"] == 4 * 64 and lookup["async"] is True


def test_the_default_loads_inside_the_step_on_vllm_029_and_later(real_peer, tmp_path, monkeypatch):
    """Without async_load in the extra config the connector loads inside the
    step on vLLM >= 0.29 (which would start an async load only after the
    step's forward and report it a step later: 12-20 ms more to an 8K
    restore's first token on the H100, 2026-12-06), between steps before.
    Through this vLLM's real scheduler: the lookup says which, the restore
    is scheduled in its lookup's step when sync (no finished_recving round
    trip), and its bytes and output are the first engine's."""
    from orbitkv import hooktrace
    from orbitkv.vllm._compat import _at_least, vllm_version

    sync = _at_least(vllm_version(), (0, 29))
    prompt = _prompt(43, 300)
    first = _warm(real_peer.socket, {"p": prompt}, num_blocks=256)
    monkeypatch.setenv("ORBITKV_HOOK_TRACE", str(tmp_path / "hooks"))
    h = Harness(real_peer.socket, num_blocks=256, extra={"async_load": None})  # the connector's own default
    try:
        assert h.connector.cfg.async_load is (not sync)
        h.add("p2", prompt)
        h.run()
        assert set(h.finished) == {"p2"} and h.loaded_pages == 4
        assert h.checked_tokens >= 4 * 64
        assert h.finished["p2"].tokens == first.finished["p"].tokens
    finally:
        h.close()
    lines = hooktrace.read_lines(str(tmp_path / "hooks"))
    lookup = next(v for d in lines for v in d.get("lookups", []) if v["req"] == "p2" and v["tokens"])
    assert lookup["async"] is (not sync)
    sched = [d for d in lines if d["side"] == "scheduler"]
    at_lookup = next(d for d in sched if any(v["req"] == "p2" and v["tokens"] for v in d.get("lookups", [])))
    scheduled_there = any(v["req"] == "p2" for v in at_lookup.get("scheduled", []))
    recving = any("p2" in d.get("recving", []) for d in lines)
    assert (scheduled_there, recving) == ((True, False) if sync else (False, True))


def test_pages_vllm_holds_itself_are_looked_up_but_not_leased(real_peer):
    """A prompt whose first 4 pages sit in vLLM's own prefix cache (a shorter
    prompt with the same head ran in this engine just before) tells the peer
    so with its lookup (lease_from 4): the lease, and the query budget, take
    only the 4 pages it restores. Its output equals the first engine's."""
    prompt = _prompt(5, 8 * 64 + 20)
    first = _warm(real_peer.socket, {"p": prompt}, num_blocks=256)
    h = Harness(real_peer.socket, num_blocks=256)
    try:
        backend = h.scheduler.connector._sched.backend
        asked: list[int] = []  # each lookup's lease_from
        real_lookup = backend.lookup

        def spy(keys, **kw):
            asked.append(kw.get("lease_from", 0))
            return real_lookup(keys, **kw)

        backend.lookup = spy
        h.add("head", prompt[: 4 * 64 + 10])
        h.run()
        assert h.loaded_pages == 4 and asked[-1] == 0  # nothing local yet: leased from page 0
        h.add("full", prompt)
        h.run()
        assert set(h.finished) == {"head", "full"}
        assert asked[-1] == 4, asked  # vLLM's cache holds the head's 4 pages: not leased
        assert h.loaded_pages == 4 + 4  # the full prompt restored pages 4..7 only
        assert h.finished["full"].tokens == first.finished["p"].tokens
    finally:
        h.close()


def test_without_the_connector_nothing_is_restored_and_outputs_match(real_peer):
    prompt = _prompt(4, 500)
    with_conn = _warm(real_peer.socket, {"x": prompt}, num_blocks=128)
    h = Harness(real_peer.socket, num_blocks=128, connector=False)
    try:
        h.add("x", prompt)
        h.run()
        assert h.loaded_pages == 0 and h.finished["x"].tokens == with_conn.finished["x"].tokens
    finally:
        h.close()


# --- cache identity: what vLLM keys its own prefix cache on beside the tokens -------------


def _lora(name: str, int_id: int = 1):
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=name, lora_int_id=int_id, lora_path=f"/adapters/{name}")


def _image(identifier: str, offset: int = 10, length: int = 100):
    from vllm.multimodal.inputs import MultiModalFeatureSpec, PlaceholderRange

    return [MultiModalFeatureSpec(data=None, modality="image", identifier=identifier,
                                  mm_position=PlaceholderRange(offset=offset, length=length))]


# (first request's extras, another request's with the same tokens, the first's again[, pages
# the two share: before the image]); the prompt's image placeholders sit at 10..109 (pages 0, 1)
_IDENTITY = {
    "lora-vs-base": ({"lora_request": _lora("sql")}, {}, {"lora_request": _lora("sql")}),
    "base-vs-lora": ({}, {"lora_request": _lora("sql")}, {}),
    "two-adapters": ({"lora_request": _lora("sql", 1)}, {"lora_request": _lora("chat", 2)},
                     {"lora_request": _lora("sql", 1)}),
    "two-images": ({"mm_features": _image("image-a")}, {"mm_features": _image("image-b")},
                   {"mm_features": _image("image-a")}),
    "image-moved": ({"mm_features": _image("image-a")}, {"mm_features": _image("image-a", offset=12, length=98)},
                    {"mm_features": _image("image-a")}),
    # vLLM's own cache shares the blocks before an image: so does OrbitKV, page 0 only
    "images-from-page-1": ({"mm_features": _image("image-a", offset=70, length=40)},
                           {"mm_features": _image("image-b", offset=70, length=40)},
                           {"mm_features": _image("image-a", offset=70, length=40)}, 1),
    "two-salts": ({"cache_salt": "tenant-a"}, {"cache_salt": "tenant-b"}, {"cache_salt": "tenant-a"}),
    "salt-vs-none": ({"cache_salt": "tenant-a"}, {}, {"cache_salt": "tenant-a"}),
}


@pytest.mark.parametrize("case", list(_IDENTITY))
def test_requests_vllm_keys_apart_share_no_page_and_equal_ones_do(real_peer, case):
    """Equal prompt tokens, other extras (LoRA adapter, image, cache salt): vLLM's
    own prefix cache keeps the two apart, so must OrbitKV — the second request
    gets no external hit tokens and loads nothing — while a request with the
    first one's extras restores all 4 of its pages. (Before page keys covered
    extras, the second request got all 4 pages of the first's KV.)"""
    first, other, same, *rest = _IDENTITY[case]
    shared = rest[0] if rest else 0
    prompt = _prompt(40, 300)  # 4 whole pages
    prompt[10:110] = [5] * 100  # image placeholder ids
    _warm_extras = Harness(real_peer.socket, num_blocks=256)
    try:
        _warm_extras.add("a", prompt, **first)
        _warm_extras.run()
        assert set(_warm_extras.finished) == {"a"}
    finally:
        _warm_extras.close()  # joins the saves
    h = Harness(real_peer.socket, num_blocks=256)
    try:
        got: dict[str, object] = {}
        conn = h.scheduler.connector
        real = conn.get_num_new_matched_tokens

        def spy(request, num_computed_tokens):
            res = real(request, num_computed_tokens)
            if res[0] is not None:
                got[request.request_id] = res[0]
            return res

        conn.get_num_new_matched_tokens = spy
        h.add("b", prompt, **other)
        h.run()
        assert got["b"] == shared * 64 and h.loaded_pages == shared, (case, got, h.loaded_pages)
        h.add("c", prompt, **same)
        h.run()
        assert set(h.finished) == {"b", "c"}
        # the shared pages are in vLLM's own cache now (b computed them): c restores the rest
        assert got["c"] == (4 - shared) * 64 and h.loaded_pages == 4, (case, got, h.loaded_pages)
    finally:
        h.close()


def test_a_request_whose_extras_cannot_be_keyed_is_a_miss_and_saves_nothing(real_peer):
    """Prompt embeddings (vLLM keys their bytes; the connector does not):
    the request gets no external hit though the peer holds its tokens' pages,
    and none of its own pages are saved."""
    import torch

    held, fresh = _prompt(41, 300), _prompt(42, 300)
    _warm(real_peer.socket, {"a": held}, num_blocks=256)
    h = Harness(real_peer.socket, num_blocks=256)
    try:
        h.add("e1", held, prompt_embeds=torch.zeros(300, 8))
        h.add("e2", fresh, prompt_embeds=torch.zeros(300, 8))
        h.run()
        assert set(h.finished) == {"e1", "e2"} and h.loaded_pages == 0
    finally:
        h.close()
    h = Harness(real_peer.socket, num_blocks=256)
    try:
        h.add("plain", fresh)  # e2's tokens without embeddings: nothing of e2 was saved
        h.run()
        assert h.loaded_pages == 0
    finally:
        h.close()


# --- the seeds' restore-admission stall ------------------------------------------------


# vLLM 0.26's scheduler stalls in the shape below without the gate; 0.33's does not (it
# completes both requests). Versions between them were not run.
SCHEDULER_STALLS = not _at_least(vllm_version(), (0, 33))
STALL_STEPS = 200  # steps a stalled engine is run for after its restore's load ended


def _stall(socket: str, gate: bool, restore: list[int], cold: list[int], max_steps: int = 100000) -> Harness:
    """Priority scheduling: a restore R (priority 1) is allocated and loading when a cold
    request C of higher priority (0) arrives that needs one block more than is free.
    vLLM 0.26's waiting pass takes C first, fails its allocation and stops; R's finished
    load is never promoted, so its blocks are never freed: no request moves again. The
    gate defers C (its lookup returns None) while R holds admission, so R runs first."""
    bs = 64
    need = len(cold) // bs  # blocks C needs for its prompt: 128
    held = (len(restore) - 1) // bs  # blocks R's restore allocates (its last token is computed): 127
    # block 0 is vLLM's null block; once R is allocated, one block fewer than C needs is free
    h = Harness(socket, num_blocks=1 + held + need - 1, block_size=bs, max_batched=16384, policy="priority",
                extra={"gate": gate})
    h.add("R", restore, priority=1)
    h.step()  # R: hit, blocks allocated, async load started
    assert h.scheduler.requests["R"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    assert h.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == need - 1
    h.add("C", cold, priority=0)
    # Steps, never a time budget: a step that computes nothing waits for R's load to end
    # (Harness.run), so a stalled engine is shown stalled for max_steps steps after it.
    h.run(max_steps=max_steps)
    return h


def test_stall_without_the_gate_and_progress_with_it(real_peer):
    """What it proves depends on the installed vLLM (SCHEDULER_STALLS). On 0.26: without
    the gate the engine stalls for good (no token computed in STALL_STEPS steps after R's
    load ended), with it both requests finish. On 0.33, whose scheduler no longer stalls in
    this shape: both finish either way, and the gate still holds — C is deferred while R
    holds admission, R's restore is whole and nothing is preempted."""
    restore, cold = _prompt(5, 8192), _prompt(6, 8192)
    _warm(real_peer.socket, {"warm": restore}, num_blocks=260, block_size=64)
    ungated = _stall(real_peer.socket, gate=False, restore=restore, cold=cold,
                     max_steps=STALL_STEPS if SCHEDULER_STALLS else 100000)
    try:
        if SCHEDULER_STALLS:
            assert not ungated.finished, ungated.finished  # neither request ever completes
            assert "R" in ungated.scheduler.finished_recving_kv_req_ids  # though R's load finished
            assert ungated.scheduled_tokens == 0 and ungated.steps >= STALL_STEPS  # not one token computed
        else:  # the premise is gone: if a later vLLM stalls again, this says so
            assert set(ungated.finished) == {"R", "C"}, (ungated.finished, ungated.steps)
            assert ungated.failed_blocks == 0
    finally:
        ungated.close()
    # a cold request of its own: on 0.33 the ungated run computed (and saved) C's prompt
    gated = _stall(real_peer.socket, gate=True, restore=restore, cold=_prompt(96, 8192))
    try:
        assert set(gated.finished) == {"R", "C"}, (gated.finished, gated.steps)
        assert (gated.loaded_pages, gated.failed_blocks, gated.preempted) == (127, 0, 0)
        g = gated.connector.scheduler.gate
        assert not g.queue_aware  # priority scheduling: the strict gate
        assert g.totals.deferred_misses >= 1 and g.totals.restores == 1, g.totals  # C waited for R
    finally:
        gated.close()


def _fcfs_stall_shape(socket: str, gate, restore: list[int], cold: list[int]) -> Harness:
    """The stall's shape under FCFS: R allocated and loading, then a cold C needing one
    block more than is free."""
    bs = 64
    need, held = len(cold) // bs, (len(restore) - 1) // bs
    h = Harness(socket, num_blocks=1 + held + need - 1, block_size=bs, max_batched=16384, extra={"gate": gate})
    h.add("R", restore)
    h.step()
    assert h.scheduler.requests["R"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
    h.add("C", cold)
    h.run()
    return h


def test_fcfs_visits_the_restore_before_new_requests_so_the_gate_need_not_defer_them(real_peer):
    """vLLM 0.26 under FCFS takes requests from its skipped queue (where a restoring
    request waits) before any new one, so a cold request cannot stand in front of a
    restore: even with the gate off the stall's shape completes. The queue-aware gate
    relies on that order (orbitkv.gate): if a vLLM changes it, this test says so."""
    restore = _prompt(7, 8192)
    _warm(real_peer.socket, {"warm": restore}, num_blocks=260, block_size=64)
    for gate, cold in ((False, _prompt(8, 8192)), (True, _prompt(9, 8192))):  # each C cold: the first is saved
        h = _fcfs_stall_shape(real_peer.socket, gate, restore, cold)
        try:
            assert set(h.finished) == {"R", "C"}, (gate, h.finished, h.steps)
            assert (h.loaded_pages, h.failed_blocks) == (127, 0)
            if gate:
                g = h.connector.scheduler.gate
                assert g.queue_aware and g.capacity_blocks == h.num_blocks - 1
                assert g.totals.deferred_misses == 0 and g.totals.restores == 1  # C was never held off
        finally:
            h.close()


def test_fcfs_restores_hold_admission_together_while_they_fit_and_complete_exactly(real_peer):
    """Five restores arriving at once into a 48-block cache: the queue-aware gate lets
    restores hold admission together only while their prompts' blocks fit the cache
    (two of 19 here), defers the third, and every request's output equals a run
    without the connector."""
    prefixes = [_prompt(50 + i, 1024) for i in range(5)]
    prompts = {f"r{i}": prefixes[i] + _prompt(60 + i, 100) for i in range(5)}
    ref = Harness(real_peer.socket, num_blocks=400, connector=False)
    for rid, p in prompts.items():
        ref.add(rid, p, max_tokens=8)
    ref.run()
    ref.close()
    _warm(real_peer.socket, {f"w{i}": p for i, p in enumerate(prefixes)}, num_blocks=400, block_size=64)
    h = Harness(real_peer.socket, num_blocks=48, block_size=64, max_batched=4096)
    try:
        g = h.connector.scheduler.gate
        for rid, p in prompts.items():
            h.add(rid, p, max_tokens=8)
        h.step()
        assert sorted(g._holds) == ["r0", "r1"], g._holds
        for rid in ("r2", "r3", "r4"):  # deferred: no blocks, no load
            r = h.scheduler.requests[rid]
            assert (r.status, r.num_computed_tokens) == (RequestStatus.WAITING, 0), (rid, r.status)
        h.run()
        assert set(h.finished) == set(prompts)
        for rid in prompts:
            assert h.finished[rid].tokens == ref.finished[rid].tokens, rid
        assert g.totals.restores == 5 and g.totals.max_holders == 2 and g.totals.deferred_restores >= 3
        assert h.loaded_pages == 5 * 16 and h.failed_blocks == 0
        assert h.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 48 - 1
    finally:
        h.close()


def test_priority_scheduling_keeps_the_strict_gate(real_peer):
    h = Harness(real_peer.socket, num_blocks=64, block_size=64, policy="priority")
    try:
        assert not h.connector.scheduler.gate.queue_aware
    finally:
        h.close()


# --- preemption, cancellation, failures ------------------------------------------------


def test_preemption_under_a_small_cache_completes_every_request_exactly(real_peer):
    prompts = {f"p{i}": _prompt(10 + i % 2, 320) + _prompt(20 + i, 40) for i in range(6)}
    ref = Harness(real_peer.socket, num_blocks=400, connector=False)
    for rid, p in prompts.items():
        ref.add(rid, p, max_tokens=120)
    ref.run()
    ref.close()
    _warm(real_peer.socket, {"seed": prompts["p0"][:320]}, num_blocks=64)
    h = Harness(real_peer.socket, num_blocks=48, max_batched=512)  # room for two: decode growth preempts
    try:
        for rid, p in prompts.items():
            h.add(rid, p, max_tokens=120)
        h.run()
        assert set(h.finished) == set(prompts)
        for rid in prompts:
            assert h.finished[rid].tokens == ref.finished[rid].tokens, rid
        assert h.preempted > 0, "the cache was meant to force preemptions"
        assert h.loaded_pages > 0 and h.failed_blocks == 0
        assert h.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 48 - 1
    finally:
        h.close()


def test_a_cancelled_restore_releases_admission_and_its_lease(real_peer):
    restore, other = _prompt(30, 2048), _prompt(31, 2048)
    _warm(real_peer.socket, {"w": restore}, num_blocks=128, block_size=64)
    h = Harness(real_peer.socket, num_blocks=128, block_size=64)
    try:
        h.add("R", restore)
        h.step()
        assert h.scheduler.requests["R"].status == RequestStatus.WAITING_FOR_REMOTE_KVS
        h.abort("R")
        # Admission is free at once: a new request is not deferred behind the cancelled restore.
        assert h.connector.scheduler.gate.query("probe").name != "DEFER"
        h.add("O", other)
        h.run()
        assert "O" in h.finished
        # The cancelled restore's lease went with its load, while the engine still runs.
        m = real_peer.metrics()
        assert m.get("orbitkv_fabric_leases", 0) == 0, m
    finally:
        h.close()


def test_a_load_that_fails_is_recomputed_and_the_request_completes(real_peer):
    prompt = _prompt(40, 1024)
    first = _warm(real_peer.socket, {"w": prompt}, num_blocks=128, block_size=64)
    h = Harness(real_peer.socket, num_blocks=128, block_size=64)
    try:
        h.add("R", prompt)
        h.step(before_load=real_peer.restart)  # the DRAM pages and the lease are gone when the load runs
        h.run()
        assert "R" in h.finished and h.finished["R"].tokens == first.finished["w"].tokens
        assert h.finished["R"].reason != "error" and h.failed_blocks > 0
    finally:
        h.close()


# --- a page that keeps failing to load (issue 33) ----------------------------------------

BAD_STEPS = 300  # far more steps than a 5-page prompt needs, far fewer than a reload loop takes


class FailingPages:
    """The client seam: the worker's loads report every page in ``bad`` (keys of TP rank
    0) as failed (DEADLINE: a remote fetch that timed out) however often it is asked for,
    while the peer keeps listing it; ``attempts`` counts the loads that asked for one."""

    def __init__(self, h: Harness, bad: set[bytes]) -> None:
        self.bad, self.attempts = bad, 0
        self.session = h.worker.worker.session
        self._load = self.session.load
        self.session.load = self.load

    def load(self, pages, **kw):
        from orbitkv.client import OpResult, PageCode, PageResult

        pages = list(pages)
        op = self._load(pages, **kw)
        res = op.wait(30.0)
        hit = [p.key in self.bad for p in pages]
        self.attempts += any(hit)
        fail = PageResult(PageCode.DEADLINE, message="test: remote fetch timed out")
        op._result = OpResult(res.op_id, res.done, tuple(fail if b else r for b, r in zip(hit, res.pages)))
        return op


def _page_keys(h: Harness, prompt: list[int]) -> list[bytes]:
    from orbitkv import keys

    cfg = h.connector.scheduler.cfg
    return keys.chain(cfg.layout.fingerprint(), cfg.layout.page_tokens, prompt)


def _run_with_a_bad_page(socket: str, prompt: list[int], bad_page: int, policy: str,
                         rids: tuple[str, ...] = ("R",)) -> tuple[Harness, FailingPages, list[int]]:
    """A fresh engine, page ``bad_page`` of the prompt failing every load; the requests
    ``rids`` (the same prompt) one after another, each run for at most BAD_STEPS steps.
    Returns the harness, the seam and each request's engine steps."""
    h = Harness(socket, num_blocks=128, block_size=16, failure_policy=policy)
    seam = FailingPages(h, {_page_keys(h, prompt)[bad_page]})
    steps = []
    for rid in rids:
        h.add(rid, prompt)
        steps.append(_run_settled(h))
    return h, seam, steps


def _run_settled(h: Harness) -> int:
    """Steps until every request finished, at most BAD_STEPS; after each step, waits
    (bounded) for the loads and saves it started, so that steps count engine work, not
    polls of an operation in flight (a save still running on a loaded machine kept a
    finished request's steps going past BAD_STEPS). Returns the steps taken."""
    for i in range(BAD_STEPS):
        if not h.scheduler.has_requests() and h._idle():
            return i
        so = h.step()
        for st in list(h.worker.worker._loads.values()):
            st.future.result()  # bounded by the load deadline (5 s) and its grace, not by us
        if so.total_num_scheduled_tokens == 0:
            h.wait_for_transfer()  # an idle step waits for a save in flight, as Harness.run does
    return BAD_STEPS


@pytest.mark.parametrize("bad_page", [0, 2])
def test_a_page_that_keeps_failing_to_load_is_tried_once_and_the_request_completes(real_peer, bad_page):
    """Issue 33: a page the peer keeps listing but whose load keeps failing. The request
    loads it once; the pages before it stay loaded (vLLM is not asked to compute them),
    the failed page and those after it are computed, and the output is exact. (The hit
    was offered again after every failed load: with the first page failing, vLLM 0.26
    asked again from token 0 and the request reloaded forever.)"""
    prompt = _prompt(70 + bad_page, 5 * 64 + 20)
    first = _warm(real_peer.socket, {"w": prompt}, num_blocks=128)
    h, seam, (steps,) = _run_with_a_bad_page(real_peer.socket, prompt, bad_page, "recompute")
    try:
        assert "R" in h.finished, (steps, seam.attempts, h.loaded_pages)
        assert steps < BAD_STEPS and seam.attempts == 1, (steps, seam.attempts)
        assert h.finished["R"].tokens == first.finished["w"].tokens
        assert h.loaded_pages == 5  # one load of the whole hit
        # computed: the failed page, those after it, the tail and one decode step
        assert h.scheduled_tokens == len(prompt) - bad_page * 64 + 1, h.scheduled_tokens
    finally:
        h.close()


def test_blocks_claimed_for_a_failed_async_load_are_written_or_reported(real_peer):
    """vLLM >= 0.29 no longer zeroes the blocks it allocates for an async load
    (skip_zeroing_group_ids): every block claimed for a load must be written by it or
    reported failed. The engine's blocks are filled with garbage first (another request's
    KV, then a constant); page 2 of 5 fails: pages 0-1 are read as loaded, the rest is
    recomputed, and the synthetic runner checks every block a step reads (Harness._check)."""
    prompt = _prompt(72, 5 * 64 + 20)
    first = _warm(real_peer.socket, {"w": prompt}, num_blocks=128)
    h = Harness(real_peer.socket, num_blocks=128, block_size=16)
    try:
        h.add("X", _prompt(73, 1500), max_tokens=1)  # its KV, then garbage, in most blocks
        h.run()
        h.scheduler.reset_prefix_cache()
        h.phys.fill_(12345.0)
        seam = FailingPages(h, {_page_keys(h, prompt)[2]})
        h.add("R", prompt)
        steps = _run_settled(h)
        assert "R" in h.finished and h.finished["R"].tokens == first.finished["w"].tokens, (steps, seam.attempts)
        assert seam.attempts == 1 and h.loaded_pages == 5
        assert h.failed_blocks == 3 * 4 and not h.failed_recving  # pages 2-4, per block
        assert h.scheduled_tokens - 1500 == len(prompt) - 2 * 64 + 1, h.scheduled_tokens
    finally:
        h.close()


@pytest.mark.parametrize("bad_page", [0, 2])
def test_under_the_fail_policy_the_next_request_is_not_offered_the_failed_page(real_peer, bad_page):
    """Under kv_load_failure_policy "fail" vLLM fails the request whose page failed to
    load (its blocks are not cached). The next request with the same prompt is offered
    only the pages before the failed one: it loads those, computes the rest and completes,
    instead of failing on the same page again."""
    prompt = _prompt(80 + bad_page, 5 * 64 + 20)
    first = _warm(real_peer.socket, {"w": prompt}, num_blocks=128)
    h, seam, steps = _run_with_a_bad_page(real_peer.socket, prompt, bad_page, "fail", ("R", "S"))
    try:
        assert set(h.finished) == {"R", "S"} and max(steps) < BAD_STEPS, (steps, seam.attempts)
        assert h.finished["R"].reason == "error" and seam.attempts == 1, seam.attempts
        assert h.finished["S"].reason != "error" and h.finished["S"].tokens == first.finished["w"].tokens
        assert h.loaded_pages == 5 + bad_page  # S: the pages before the failed one
    finally:
        h.close()


# --- hits by tier (vLLM >= 0.33: vllm:prompt_tokens_cached_by_source_total) ---------------

def _hit_sources_in_vllm():
    return pytest.importorskip("vllm.v1.metrics.cache_hit_source",
                               reason="this vLLM counts no cached tokens by source (0.33 does)")


def _save_then_restore(socket: str, prompt: list[int], before_restore=None) -> list[tuple[int, dict]]:
    a = Harness(socket, num_blocks=64)
    try:
        a.add("a", prompt)
        a.run()
    finally:
        a.close()  # joins the saves
    b = Harness(socket, num_blocks=64)
    try:
        if before_restore is not None:
            before_restore(b)
        seen = b.record_hits_by_source()
        b.add("b", prompt)
        b.run()
        assert "b" in b.finished
        return seen
    finally:
        b.close()


def test_dram_hits_of_a_real_peer_are_attributed_host(real_peer):
    _hit_sources_in_vllm()
    prompt = _prompt(71, 4 * 64 + 10)  # 4 pages saved, 4 restored
    seen = _save_then_restore(real_peer.socket, prompt)
    assert seen == [(4 * 64, {"host": 4 * 64})], seen


def test_ssd_and_remote_hits_are_attributed_disk_and_p2p(fake_peer):
    """The fake peer's tier seam: page 0 in its DRAM, 1 on its SSD, 2 and 3 on another peer."""
    _hit_sources_in_vllm()
    from orbitkv import keys

    prompt = _prompt(72, 4 * 64 + 10)

    def tiers(b: Harness) -> None:
        ks = keys.chain(b.connector.scheduler._fps[0], 64, prompt)
        assert len(ks) == 4 and all(k in fake_peer.fake.store for k in ks)
        fake_peer.fake.tiers = {ks[1]: "ssd", ks[2]: "remote", ks[3]: "remote"}

    seen = _save_then_restore(fake_peer.socket, prompt, tiers)
    assert seen == [(4 * 64, {"host": 64, "disk": 64, "p2p": 2 * 64})], seen


# --- early_free: blocks freed at finish, a reuse waits for their saves (orbitkv.vllm.fences) ---------


def _hold_saves(h: Harness):
    """The harness worker's saves wait until the returned event is set; a
    flush (begin_step with a non-empty meta.flush) sets it before it waits,
    and the flushes it saw are recorded in the returned list."""
    import threading

    w = h.worker.worker
    release, flushed = threading.Event(), []
    run_save, begin = w._run_save, w.begin_step

    def held_save(spec, ready=None):
        release.wait(300)  # set by the test or by a flush below; the bound only keeps a broken run from hanging
        return run_save(spec, ready)

    def spying_begin(meta):
        if not meta.flush:
            return begin(meta)
        release.set()
        begin(meta)
        with w._lock:  # what the step may write only once the flush returned: every save of those requests ended
            ended = all(f.done() for r in meta.flush for f in w._saves.get(r, ()))
        flushed.append((list(meta.flush), ended))

    w._run_save, w.begin_step = held_save, spying_begin
    return release, flushed


@pytest.mark.parametrize("zero_new_blocks", [False, True], ids=["plain", "zeroing"])
def test_early_free_reuses_a_block_only_after_its_save_read_it(real_peer, zero_new_blocks):
    """Request a's two pages are saved while the saves are held; a finishes
    and, with early_free, vLLM frees its blocks at once; b is big enough to
    be given them. The step that gives them out must wait for a's saves
    (flush) before b writes, so the pages a fresh engine restores for a's
    prompt hold a's KV (the harness checks every restored token's bytes).
    Without the flush the held saves run only after b's first step wrote
    the blocks, and the restore check fails. "zeroing": the engine zeroes
    new blocks before bind_connector_metadata (vLLM does where its backend
    needs it), so the flush must already have run in handle_preemptions."""
    a_prompt, b_prompt = _prompt(70, 128), _prompt(71, 300)
    h = Harness(real_peer.socket, num_blocks=21, extra={"early_free": True}, zero_new_blocks=zero_new_blocks)
    release, flushed = _hold_saves(h)
    try:
        h.add("a", a_prompt, max_tokens=2)
        for _ in range(20):
            if "a" in h.finished:
                break
            h.step()
        assert "a" in h.finished and not release.is_set(), "a must finish with its saves in flight"
        fences = h.connector.scheduler.fences
        assert fences.released_total == 1 and fences.fenced_blocks == 8  # 2 pages x 4 blocks
        h.add("b", b_prompt, max_tokens=2)
        for _ in range(20):  # step until b has computed its prompt; then the saves go on regardless
            b = h.scheduler.requests.get("b")
            if b is None or b.num_computed_tokens > 0:
                break
            h.step()
        release.set()
        h.run(max_steps=1000)
        assert set(h.finished) == {"a", "b"}
        assert flushed and "a" in flushed[0][0], "b's step reused a's blocks without waiting for a's saves"
        assert all(ended for _, ended in flushed), "a flush returned before the saves it waits for ended"
        assert fences.fenced_blocks == 0, "the workers' SavesDone reports end every fence"
        assert h.connector.scheduler.frees_total["early_frees"] >= 1
        assert h.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 21 - 1
    finally:
        h.close()
    fresh = Harness(real_peer.socket, num_blocks=64)
    try:
        fresh.add("a2", a_prompt + _prompt(72, 20))
        fresh.run(max_steps=1000)
        assert "a2" in fresh.finished
        assert fresh.loaded_pages == 2 and fresh.failed_blocks == 0
        assert fresh.checked_tokens >= 128  # a's restored bytes were checked before b2 computed on them
    finally:
        fresh.close()


def test_by_default_a_finished_request_keeps_its_blocks_until_its_saves_end(real_peer):
    """early_free off (the default): request_finished delays the free and
    nothing is fenced; the counters say which way each free went."""
    h = Harness(real_peer.socket, num_blocks=64)
    try:
        h.add("a", _prompt(73, 128), max_tokens=2)
        h.run(max_steps=1000)
        sched = h.connector.scheduler
        assert sched.fences.released_total == 0 and sched.fences.fenced_blocks == 0
        assert sched.frees_total == {"delayed_frees": 1, "early_frees": 0, "flushes": 0}
        assert h.scheduler.kv_cache_manager.block_pool.get_num_free_blocks() == 64 - 1
    finally:
        h.close()
