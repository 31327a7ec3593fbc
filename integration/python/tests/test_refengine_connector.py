"""The reference engine's KV connector seam, driven in vLLM's V1 call order.

`DictKVConnector` below is a TEST DOUBLE: an in-process connector whose "external cache" is
a dict of page copies. It exists only to pin the engine's side of the seam (call order,
sync/async loads, load errors, delayed frees). The real connector, orbitkv.vllm, is tested
against the peer in test_vllm_connector.py; the last tests here run the engine with it
against a peer end to end.
"""

import dataclasses
import random
from typing import Dict, List, Set, Tuple

import pytest
import torch

from orbitkv.refengine import PRESETS, engine_config
from orbitkv.refengine.blocks import hash_block
from orbitkv.refengine.engine import Engine
from orbitkv.refengine.request import RequestStatus
from tests.test_refengine import bit_exact

V = PRESETS["tiny"].vocab
B, PT = 4, 16


def tiny(**kw):
    kw.setdefault("kv_tokens", 1024)
    return engine_config("tiny", block_size=B, page_tokens=PT, **kw)


def prompts(n, length, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(V) for _ in range(length)] for _ in range(n)]


def recompute(ps, max_tokens):
    with Engine(tiny()) as e:
        return [e.generate([p], max_tokens)[0] for p in ps]


def page_hashes(tokens: List[int]) -> List[bytes]:
    out: List[bytes] = []
    for i in range(len(tokens) // PT):
        out.append(hash_block(out[-1] if out else None, tokens[i * PT:(i + 1) * PT]))
    return out


# --- the test double ---------------------------------------------------------------------------

class DictStore:
    """The double's external cache, shared by both halves (and by several engines)."""

    def __init__(self):
        self.pages: Dict[bytes, List[torch.Tensor]] = {}  # page hash → per layer (2, bpp, B, H, D)
        self.fail: Set[bytes] = set()                     # pages whose loads fail (NaN written)
        self.calls: List[Tuple[str, str, object]] = []    # (role, method, detail)
        self.delayed: Set[str] = set()                    # requests whose free the double delays
        self.hold_recv = False                            # keep async loads "in flight"
        self.defer_lookups = 0                            # answer None this many times

    def names(self, role=None):
        return [m for r, m, _ in self.calls if role in (None, r)]


@dataclasses.dataclass
class DoubleMeta:
    loads: List[Tuple[str, List[Tuple[bytes, List[int]]], bool]]
    saves: List[Tuple[bytes, List[int]]]


class DictKVConnector:
    """TEST DOUBLE of a vLLM V1 KV connector (one instance per role)."""

    def __init__(self, role: str, store: DictStore, async_load=False, delay_free=False):
        self.role, self.store = role, store
        self.async_load, self.delay_free = async_load, delay_free
        self.bpp = PT // B
        # scheduler half
        self._first_page: Dict[str, int] = {}
        self._loads: list = []
        self._blocks: Dict[str, List[int]] = {}
        self._prompt: Dict[str, List[int]] = {}
        self._saved: Dict[str, int] = {}
        # worker half
        self.kv: List[torch.Tensor] = []
        self._meta = None
        self._recving: Set[str] = set()
        self._errors: Set[int] = set()
        self._sending: Set[str] = set()

    def _log(self, method, detail=None):
        self.store.calls.append((self.role, method, detail))

    # scheduler side -------------------------------------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens):
        self._log("get_num_new_matched_tokens", (request.request_id, num_computed_tokens))
        if self.store.defer_lookups:
            self.store.defer_lookups -= 1
            return None, False
        prompt = request.prompt_token_ids
        hit = 0
        for h in page_hashes(prompt)[:(len(prompt) - 1) // PT]:
            if h not in self.store.pages:
                break
            hit += 1
        if num_computed_tokens % PT or hit * PT <= num_computed_tokens:
            return 0, False
        self._first_page[request.request_id] = num_computed_tokens // PT
        return hit * PT - num_computed_tokens, self.async_load

    def update_state_after_alloc(self, request, blocks, num_external_tokens):
        self._log("update_state_after_alloc", (request.request_id, num_external_tokens))
        if num_external_tokens == 0:
            return
        ids = blocks.get_block_ids()[0]
        first = self._first_page[request.request_id]
        hashes = page_hashes(request.prompt_token_ids)
        pages = [(hashes[p], ids[p * self.bpp:(p + 1) * self.bpp])
                 for p in range(first, first + num_external_tokens // PT)]
        self._loads.append((request.request_id, pages, self.async_load))

    def build_connector_meta(self, so):
        self._log("build_connector_meta", so.total_num_scheduled_tokens)
        meta = DoubleMeta(self._loads, [])
        self._loads = []
        for nr in so.scheduled_new_reqs:
            self._blocks[nr.req_id] = list(nr.block_ids[0])
            self._prompt[nr.req_id] = list(nr.prompt_token_ids)
            self._plan_saves(nr.req_id, nr.num_computed_tokens + so.num_scheduled_tokens[nr.req_id], meta)
        cr = so.scheduled_cached_reqs
        for i, rid in enumerate(cr.req_ids):
            new = cr.new_block_ids[i]
            if cr.resumed_from_preemption[i]:
                self._blocks[rid] = list(new[0])
            elif new is not None:
                self._blocks[rid].extend(new[0])
            self._plan_saves(rid, cr.num_computed_tokens[i] + so.num_scheduled_tokens[rid], meta)
        return meta

    def _plan_saves(self, rid, computed_after, meta):
        prompt, blocks = self._prompt[rid], self._blocks[rid]
        hashes = page_hashes(prompt)
        upto = min(computed_after, len(prompt)) // PT
        for p in range(self._saved.get(rid, 0), upto):
            if hashes[p] not in self.store.pages:
                meta.saves.append((hashes[p], blocks[p * self.bpp:(p + 1) * self.bpp]))
        self._saved[rid] = max(upto, self._saved.get(rid, 0))

    def update_connector_output(self, out):
        self._log("update_connector_output", (out.finished_sending, out.finished_recving, out.invalid_block_ids))

    def request_finished(self, request, block_ids):
        self._log("request_finished", request.request_id)
        if self.delay_free:
            self.store.delayed.add(request.request_id)
        return self.delay_free, {"double": request.request_id}

    # worker side ----------------------------------------------------------------------------
    def register_kv_caches(self, kv_caches):
        self._log("register_kv_caches", list(kv_caches))
        self.kv = list(kv_caches.values())

    def bind_connector_metadata(self, meta):
        self._log("bind_connector_metadata")
        self._meta = meta

    def clear_connector_metadata(self):
        self._log("clear_connector_metadata")
        self._meta = None

    def handle_preemptions(self, meta):
        self._log("handle_preemptions")

    def start_load_kv(self, forward_context):
        self._log("start_load_kv", forward_context.attn_metadata is not None)
        for rid, pages, is_async in self._meta.loads:
            for h, ids in pages:
                idx = torch.tensor(ids)
                for layer, kv in enumerate(self.kv):
                    if h in self.store.fail or h not in self.store.pages:
                        kv[:, idx] = float("nan")
                    else:
                        kv[:, idx] = self.store.pages[h][layer]
                if h in self.store.fail or h not in self.store.pages:
                    self._errors.update(ids)
            if is_async:
                self._recving.add(rid)

    def wait_for_layer_load(self, layer_name):
        self._log("wait_for_layer_load", layer_name)

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata):
        self._log("save_kv_layer", layer_name)

    def wait_for_save(self):
        self._log("wait_for_save")
        for h, ids in self._meta.saves:
            idx = torch.tensor(ids)
            self.store.pages[h] = [kv[:, idx].clone() for kv in self.kv]

    def get_finished(self, finished_req_ids):
        self._log("get_finished", set(finished_req_ids))
        sending, self._sending = self._sending, {r for r in finished_req_ids if r in self.store.delayed}
        recving = set()
        if not self.store.hold_recv:
            recving, self._recving = self._recving, set()
        return sending or None, recving or None

    def get_block_ids_with_load_errors(self):
        self._log("get_block_ids_with_load_errors")
        out, self._errors = self._errors, set()
        return out

    def shutdown(self):
        self._log("shutdown")


def double(store, **kw):
    return DictKVConnector("scheduler", store, **kw), DictKVConnector("worker", store, **kw)


def fill_store(store, ps, max_tokens=4, **kw):
    """Run the prompts once through a fresh engine so that the double saves their pages."""
    with Engine(tiny(), double(store, **kw)) as e:
        out = e.generate(ps, max_tokens)
    for p in ps:
        assert all(h in store.pages for h in page_hashes(p))
    return out


# --- tests --------------------------------------------------------------------------------------

@bit_exact
@pytest.mark.parametrize("async_load", [False, True], ids=["sync", "async"])
def test_restore_produces_the_same_output_as_recompute(async_load):
    ps = prompts(3, 70, seed=1)
    want = recompute(ps, 8)
    store = DictStore()
    assert fill_store(store, ps, 8) == want
    store.calls.clear()
    with Engine(tiny(), double(store, async_load=async_load)) as e:
        got = e.generate(ps, 8)
        st = e.stats()
    assert got == want
    assert st["prefix_hit_tokens"] == 0  # a fresh pool: every reused token came from the store
    assert st["external_restored_tokens"] == 3 * 64 == st["external_matched_tokens"]
    allocs = [d for r, m, d in store.calls if m == "update_state_after_alloc"]
    if async_load:  # allocated with 64 external tokens, then again with 0 once loaded
        assert sorted(n for _, n in allocs) == [0, 0, 0, 64, 64, 64]
    else:
        assert [n for _, n in allocs] == [64, 64, 64]


@bit_exact
@pytest.mark.parametrize("async_load", [False, True], ids=["sync", "async"])
def test_load_errors_fall_back_to_recompute(async_load):
    ps = prompts(2, 70, seed=2)
    want = recompute(ps, 8)
    store = DictStore()
    fill_store(store, ps)
    store.fail.add(page_hashes(ps[0])[1])  # page 1 of prompt 0: NaN lands in its blocks
    with Engine(tiny(), double(store, async_load=async_load)) as e:
        got = e.generate(ps, 8)
        st = e.stats()
    assert got == want
    assert st["load_error_blocks"] == PT // B
    assert st["external_restored_tokens"] == 16 + 64  # page 0 of prompt 0, all of prompt 1


def test_call_sequence_follows_vllm():
    ps = prompts(1, 40, seed=3)
    store = DictStore()
    fill_store(store, ps)
    store.calls.clear()
    with Engine(tiny(), double(store)) as e:
        req = e.add_request(ps[0], 2)
        while e.has_work():
            e.step()
    layers = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
    w = [(m, d) for r, m, d in store.calls if r == "worker"]
    assert w[0] == ("register_kv_caches", layers)
    assert w[1:11] == [  # the first step: a sync load of 32 tokens, then 8 computed
        ("bind_connector_metadata", None), ("start_load_kv", True),
        ("wait_for_layer_load", layers[0]), ("save_kv_layer", layers[0]),
        ("wait_for_layer_load", layers[1]), ("save_kv_layer", layers[1]),
        ("wait_for_save", None), ("get_finished", set()),
        ("get_block_ids_with_load_errors", None), ("clear_connector_metadata", None)]
    assert w[-1] == ("shutdown", None)
    # the step after the request finished passes its id to get_finished, once
    assert [d for m, d in w if m == "get_finished" and d] == [{req.request_id}]
    s = [(m, d) for r, m, d in store.calls if r == "scheduler"]
    assert s[:3] == [("get_num_new_matched_tokens", (req.request_id, 0)),
                     ("update_state_after_alloc", (req.request_id, 32)), ("build_connector_meta", 8)]
    assert [m for m, _ in s].count("request_finished") == 1
    assert [m for m, _ in s].count("get_num_new_matched_tokens") == 1


class _HooksSeen(DictKVConnector):
    """The double, noting per step what start_load_kv was told (orbitkv.vllm's reading of
    the forward context) and how many layer hooks the step then called."""

    def start_load_kv(self, forward_context):
        from orbitkv.vllm.connector import _hooks_skipped

        self.store.steps.append([_hooks_skipped(forward_context), 0])
        super().start_load_kv(forward_context)

    def wait_for_layer_load(self, layer_name):
        self.store.steps[-1][1] += 1
        super().wait_for_layer_load(layer_name)


def test_a_decode_graph_step_says_full_in_the_forward_context():
    """A decode step the engine replays as a CUDA graph (DecodeGraphs; run eagerly here)
    says FULL in the forward context start_load_kv gets, as vLLM's runner does, so that
    a layer-wise connector waits for every layer before it (orbitkv.vllm); the engine
    itself calls every layer's load hook before the replay (graphs.py). Eager steps say
    otherwise and call each layer's hook in the forward."""
    from orbitkv.refengine.graphs import DecodeGraphs

    ps = prompts(2, 40, seed=5)
    store = DictStore()
    store.steps = []
    cfg = tiny()
    with Engine(cfg, (DictKVConnector("scheduler", store), _HooksSeen("worker", store))) as e:
        e.runner.graphs = DecodeGraphs(cfg, e.model, e.pool, capture=False)
        e.generate(ps, 4)
        graph_steps = e.runner.graphs.stats["eager_fixed"]
    assert graph_steps > 0, "some decode steps took the graph path"
    forwards = [skipped for skipped, hooks in store.steps if hooks]
    assert forwards.count(True) == graph_steps, store.steps
    assert all(hooks in (0, cfg.model.num_layers) for _, hooks in store.steps), store.steps
    assert all(skipped for skipped, hooks in store.steps if not hooks), "a step without a forward says so"


def test_delayed_free_holds_blocks_until_finished_sending():
    store = DictStore()
    with Engine(tiny(), double(store, delay_free=True)) as e:
        req = e.add_request(prompts(1, 30, seed=4)[0], 2)
        while not req.status.finished:
            e.step()
        assert req.kv_transfer_params_out == {"double": req.request_id}
        assert req.request_id in e.scheduler.holds
        assert e.stats()["kv_blocks_free"] < e.stats()["kv_blocks_total"]
        e.step()  # the worker hears the request finished (get_finished) ...
        e.step()  # ... and reports finished_sending one step later
        assert not e.scheduler.holds and not e.has_work()
        assert e.stats()["kv_blocks_free"] == e.stats()["kv_blocks_total"]


def test_abort_while_waiting_for_remote_kvs_holds_blocks_until_received():
    ps = prompts(1, 70, seed=5)
    store = DictStore()
    fill_store(store, ps)
    store.hold_recv = True
    with Engine(tiny(), double(store, async_load=True)) as e:
        req = e.add_request(ps[0], 4)
        e.step()
        e.step()
        assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS and e.last_step_tokens == 0
        e.abort(req.request_id)
        assert req.status == RequestStatus.FINISHED_ABORTED
        assert e.scheduler.holds[req.request_id][0] == {"recv"}
        e.step()
        assert e.has_work()  # the load is still "in flight": blocks stay held
        store.hold_recv = False
        e.step()
        assert not e.has_work() and e.stats()["kv_blocks_free"] == e.stats()["kv_blocks_total"]


@bit_exact
def test_unknown_match_is_asked_again_next_step():
    ps = prompts(1, 70, seed=6)
    want = recompute(ps, 4)
    store = DictStore()
    fill_store(store, ps)
    store.calls.clear()
    store.defer_lookups = 3
    with Engine(tiny(), double(store)) as e:
        assert e.generate(ps, 4) == want
        assert e.stats()["external_restored_tokens"] == 64
    assert store.names("scheduler").count("get_num_new_matched_tokens") == 4


@bit_exact
def test_preempted_request_is_looked_up_again_and_stays_identical():
    ps = prompts(4, 60, seed=7)
    want = recompute(ps, 24)
    store = DictStore()
    with Engine(tiny(kv_tokens=192, max_batched_tokens=64), double(store)) as e:
        got = e.generate(ps, 24)
        st = e.stats()
    assert got == want
    assert st["preemptions"] > 0
    assert "handle_preemptions" in store.names("worker")


# --- the real connector (orbitkv.vllm) against a peer ----------------------------------------------

def _orbitkv(socket, **extra):
    from orbitkv.refengine.connector import load_connector
    extra = {"socket": socket, "load_deadline_ms": 10000, "save_deadline_ms": 10000, **extra}
    return lambda cfg, pool: load_connector("orbitkv", cfg, pool, extra)


@bit_exact
@pytest.mark.parametrize("async_load", [True, False], ids=["async", "sync"])
def test_orbitkv_connector_restore_equals_recompute(peer, async_load):
    ps = prompts(3, 70, seed=8)
    want = recompute(ps, 6)
    with Engine(tiny(), _orbitkv(peer.socket, async_load=async_load)) as e:  # saves
        assert e.generate(ps, 6) == want
    with Engine(tiny(), _orbitkv(peer.socket, async_load=async_load)) as e:  # restores
        got = e.generate(ps, 6)
        st = e.stats()
    assert got == want
    assert st["prefix_hit_tokens"] == 0
    assert st["external_restored_tokens"] == 3 * 64
    assert st["kv_blocks_free"] == st["kv_blocks_total"]


@bit_exact
@pytest.mark.parametrize("async_load", [True, False], ids=["async", "sync"])
def test_orbitkv_connector_corrupt_page_is_recomputed(fake_peer, async_load):
    from orbitkv import keys
    ps = prompts(2, 70, seed=9)
    want = recompute(ps, 6)
    with Engine(tiny(), _orbitkv(fake_peer.socket, async_load=async_load)) as e:
        assert e.generate(ps, 6) == want
        layout = e.connector_scheduler.cfg.layout
    fake_peer.fake.corrupt.add(keys.chain(layout.fingerprint(), PT, ps[0])[1])
    with Engine(tiny(), _orbitkv(fake_peer.socket, async_load=async_load)) as e:
        got = e.generate(ps, 6)
        st = e.stats()
    assert got == want
    assert st["load_error_blocks"] >= PT // B
    assert st["external_restored_tokens"] == 16 + 64


def test_ttft_probe_reports_a_step_breakdown(real_peer):
    """The TTFT probe (CPU, tiny preset) restores from the peer and reports, per TTFT, the
    computing steps' CPU phases and the rest, which add up to the TTFT."""
    from orbitkv.refengine import ttft

    args = ["--orbitkv-socket", real_peer.socket, "--prompt-tokens", "256", "--prompts", "3",
            "--kv-tokens", "544", "--page-tokens", "32", "--max-batched-tokens", "128"]
    out = ttft.run(ttft.parse_args(args))
    assert out["warm_shapes"] is True
    for r in out["restore"]:
        assert r["restored_tokens"] > 0
        assert r["restored_tokens"] + r["local_hit_tokens"] == 224  # (256 - 1) // 32 * 32
        b = r["breakdown"]
        assert b["computing_steps"] >= 1
        parts = b["start_load_s"] + b["forward_s"] + b["results_s"] + b["other_s"]
        assert parts == pytest.approx(r["ttft_s"], abs=1e-3)
        assert "gpu_layer_ready_ms" not in b  # CPU: no trace
    assert out["local_prefix_hit"]["local_hit_tokens"] > 0



def test_ttft_probe_samples_are_what_they_say(real_peer):
    """An engine pool that holds every prompt (--kv-tokens 4096) would serve the "restore"
    samples from the engine's own prefix cache; the probe empties it before each sample, and
    the engine's counters show each restore restored every page and each recompute took
    nothing. A second probe with the same --seed against the same peer would time restores
    as "recompute": it fails, saying why."""
    from orbitkv.refengine import ttft

    args = ["--orbitkv-socket", real_peer.socket, "--prompt-tokens", "256", "--prompts", "2",
            "--kv-tokens", "4096", "--page-tokens", "32", "--max-batched-tokens", "128", "--no-warm-shapes"]
    out = ttft.run(ttft.parse_args(args))
    for r in out["recompute"]:
        assert r["counters"] == {"prefix_hit_tokens": 0, "external_matched_tokens": 0,
                                 "external_restored_tokens": 0, "load_error_blocks": 0}
    for r in out["restore"]:
        assert r["local_hit_tokens"] == 0 and r["restored_tokens"] == 224
        assert r["counters"]["prefix_hit_tokens"] == 0 and r["counters"]["external_restored_tokens"] == 224
    assert out["local_prefix_hit"]["counters"]["prefix_hit_tokens"] == 240  # (256 - 1) // 16 * 16
    with pytest.raises(ttft.SampleMismatch, match="recompute sample 0 is not a recompute.*same --seed"):
        ttft.run(ttft.parse_args(args))


def test_ttft_check_sample_names_what_a_sample_was():
    from orbitkv.refengine.ttft import SampleMismatch, check_sample

    def sample(local=0, matched=0, restored=0, errors=0):
        return {"counters": {"prefix_hit_tokens": local, "external_matched_tokens": matched,
                             "external_restored_tokens": restored, "load_error_blocks": errors}}

    ok = [("recompute", sample()), ("restore", sample(matched=224, restored=224)), ("local", sample(local=240))]
    for kind, s in ok:
        check_sample(kind, 0, s, 256, 16, 32)
    bad = [("recompute", sample(matched=224, restored=224), "not a recompute"),
           ("recompute", sample(local=240), "not a recompute"),
           ("restore", sample(local=240), "engine's own prefix cache served 240"),
           ("restore", sample(local=16, matched=192, restored=192), "engine's own prefix cache"),
           ("restore", sample(matched=224, restored=160), "160 of 224 tokens restored"),
           ("restore", sample(matched=224, restored=224, errors=1), "1 load-error blocks"),
           ("local", sample(local=224, matched=0), "224 of 240"),
           ("local", sample(local=240, matched=32, restored=32), "not a local prefix hit")]
    for kind, s, msg in bad:
        with pytest.raises(SampleMismatch, match=msg):
            check_sample(kind, 3, s, 256, 16, 32)


@bit_exact
def test_orbitkv_connector_partial_local_hit(peer):
    """The engine's own prefix cache holds the first 8 tokens (2 of page 0's
    4 blocks): the connector restores the other 56 of the peer's 64 tokens,
    skipping the local blocks, and the output equals recompute."""
    p = prompts(1, 70, seed=10)[0]
    q = p[:8] + prompts(1, 30, seed=11)[0]  # shares 2 blocks with p, not page 0
    want = recompute([p], 6)
    with Engine(tiny(), _orbitkv(peer.socket)) as e:  # saves p
        assert e.generate([p], 6) == want
    with Engine(tiny(), _orbitkv(peer.socket)) as e:
        e.generate([q], 2)
        before = e.stats()
        got = e.generate([p], 6)
        st = e.stats()
    assert got == want
    assert st["prefix_hit_tokens"] - before["prefix_hit_tokens"] == 8
    assert st["external_restored_tokens"] - before["external_restored_tokens"] == 64 - 8
