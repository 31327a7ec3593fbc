"""OrbitKVConnector driven through vLLM's call sequence (scheduler half and
worker half in one process, talking only through metadata), against a peer."""

import time

import pytest
import torch

from orbitkv.vllm import OrbitKVConnector, OrbitKVMetadata
from orbitkv.vllm._compat import KVConnectorRole
from tests.shm import flash_layers, pool_bytes, shm_pool
from tests.vllm_fakes import CachedRequestData, KVConnectorOutput, NewRequestData, Request, SchedulerOutput

L, NB, BS, H, D, PT = 2, 32, 4, 2, 8, 8


def _extra(socket, pt=PT, bs=BS):
    return {
        "socket": socket,
        "page_tokens": pt,
        "block_tokens": bs,
        "layout": {"model": "orbitkv/test", "revision": "r0", "dtype": "fp32", "num_layers": L,
                   "kv_heads": H, "head_dim": D, "tp_size": 1, "byte_layout": "vllm-flash"},
        "load_deadline_ms": 5000,
        "save_deadline_ms": 5000,
    }


class Engine:
    """The two connector halves plus the engine-side glue of one step."""

    def __init__(self, socket, kv, pt=PT, bs=BS, extra=None):
        extra = extra or _extra(socket, pt, bs)
        self.sched = OrbitKVConnector(extra, KVConnectorRole.SCHEDULER, None)
        self.work = OrbitKVConnector(extra, KVConnectorRole.WORKER, None)
        self.work.register_kv_caches(kv)
        self.kv = kv
        # Every step's results until an idle_until takes them: a load can end
        # within the step that starts it (its thread may finish before
        # get_transfer_results runs), and that step's caller rarely looks.
        self._seen: tuple[set, set, set, set] = (set(), set(), set(), set())

    forward_context = None  # what vLLM passes start_load_kv (its cudagraph_runtime_mode)

    def step(self, so, finished=(), before_save=None):
        meta = self.sched.build_connector_meta(so)
        assert isinstance(meta, OrbitKVMetadata)
        self.work.bind_connector_metadata(meta)
        self.work.start_load_kv(self.forward_context)
        if before_save:
            before_save()  # "the forward": writes KV into the blocks
        self.work.wait_for_save()
        res = self.work.get_transfer_results(set(finished))
        errs = self.work.get_block_ids_with_load_errors()
        self.work.clear_connector_metadata()
        self.sched.update_connector_output(KVConnectorOutput(res.finished_sending, res.finished_recving))
        for seen, got in zip(self._seen, (res.finished_sending, res.finished_recving, res.failed_recving, errs)):
            seen |= got or set()
        return meta, res, errs

    def idle_until(self, pred, finished=(), timeout=30.0):
        # 30 s: above the connector's own worst case for a load (a refused lease, then the
        # retry without it: twice the 5 s deadline plus its 2 s grace), so a slow machine
        # shows the operation's result (and the assertions on it), not a timeout.
        # The results of the steps before this call count too (self._seen).
        deadline = time.monotonic() + timeout
        first = True
        while time.monotonic() < deadline:
            self.step(SchedulerOutput(), finished if first else ())
            first = False
            sending, recving, failed, errs = self._seen
            if pred(sending, recving):
                self._seen = (set(), set(), set(), set())
                return sending, recving, failed, errs
            time.sleep(0.01)
        raise AssertionError(f"timed out waiting for connector results (seen so far: {self._seen})")

    def close(self):
        self.sched.shutdown()
        self.work.shutdown()

    def blocks_bytes(self, blocks):
        return [b"".join(t[p, b].numpy().tobytes() for t in self.kv.values() for p in (0, 1)) for b in blocks]


@pytest.fixture
def engine(peer):
    with shm_pool(pool_bytes(L, NB, BS, H, D)) as (path, pool):
        e = Engine(peer.socket, flash_layers(pool, L, NB, BS, H, D))
        yield e, peer
        e.close()


def _compute_and_save(e, req, blocks, pt=PT):
    n = len(req.prompt_token_ids)
    assert e.sched.get_num_new_matched_tokens(req, 0) == (0, False)
    e.sched.update_state_after_alloc(req, (blocks,), 0)
    so = SchedulerOutput([NewRequestData(req.request_id, req.prompt_token_ids, (blocks,), 0)], num_scheduled_tokens={req.request_id: n})

    def forward():
        for t in e.kv.values():
            t[:, blocks] = torch.randn(t[:, blocks].shape)

    meta, _, _ = e.step(so, before_save=forward)
    assert len(meta.saves) == 1 and len(meta.saves[0].blocks) == n // pt
    delay, _ = e.sched.request_finished(req, blocks)
    assert delay is True
    sending, _, _, _ = e.idle_until(lambda s, r: req.request_id in s, finished=[req.request_id])
    return sending


def test_save_then_restore_byte_exact_with_gate(engine):
    e, peer = engine
    a = Request("a", list(range(3 * PT + 1)))
    a_blocks = list(range(0, 7))
    _compute_and_save(e, a, a_blocks)

    b = Request("b", a.prompt_token_ids[: 3 * PT] + [9, 9, 9])
    n, is_async = e.sched.get_num_new_matched_tokens(b, 0)
    assert (n, is_async) == (3 * PT, True)
    b_blocks = list(range(10, 17))
    e.sched.update_state_after_alloc(b, (b_blocks,), n)
    c = Request("c", list(range(500, 500 + 2 * PT)))
    assert e.sched.get_num_new_matched_tokens(c, 0) == (None, False), "gate defers other admissions"
    meta, res, _ = e.step(SchedulerOutput())
    assert len(meta.loads) == 1
    _, recving, failed, errs = e.idle_until(lambda s, r: "b" in r)
    assert not failed and not errs
    assert e.blocks_bytes(b_blocks[:6]) == e.blocks_bytes(a_blocks[:6])
    assert e.sched.get_num_new_matched_tokens(c, 0) == (None, False), "held until first compute"
    e.sched.update_state_after_alloc(b, (b_blocks,), 0)
    so = SchedulerOutput([NewRequestData("b", b.prompt_token_ids, (b_blocks,), 3 * PT)], num_scheduled_tokens={"b": 3})
    meta, _, _ = e.step(so)
    assert meta.saves == [], "restored pages are not saved again"
    assert e.sched.get_num_new_matched_tokens(c, 0) == (0, False)
    assert e.sched.request_finished(b, b_blocks) == (False, None)


def test_a_whole_last_page_the_peer_holds_is_not_saved_again(engine):
    """A prompt that ends on a whole page: vLLM computes its last token again
    whether its prefix is resident (its own cache stops a block short) or
    restored (a load stops a page short), and that page, held by the peer
    already, is not saved again; one the peer lacks is."""
    e, _ = engine
    a = Request("a", list(range(6000, 6000 + 4 * PT)))
    a_blocks = list(range(0, 8))
    assert e.sched.get_num_new_matched_tokens(a, 0) == (0, False)
    e.sched.update_state_after_alloc(a, (a_blocks,), 0)
    so = SchedulerOutput([NewRequestData("a", a.prompt_token_ids, (a_blocks,), 0)], num_scheduled_tokens={"a": 4 * PT})
    meta, _, _ = e.step(so)
    assert [len(s.blocks) for s in meta.saves] == [4], "every whole page, the last one too"
    e.sched.request_finished(a, a_blocks)
    e.idle_until(lambda s, r: "a" in s, finished=["a"])

    # resident: vLLM's own cache holds all but the last block, which it computes again
    r = Request("resident", a.prompt_token_ids)
    assert e.sched.get_num_new_matched_tokens(r, 4 * PT - BS) == (0, False)
    e.sched.update_state_after_alloc(r, (a_blocks,), 0)
    so = SchedulerOutput([NewRequestData("resident", r.prompt_token_ids, (a_blocks,), 4 * PT - BS)],
                         num_scheduled_tokens={"resident": BS})
    meta, _, _ = e.step(so)
    assert meta.saves == [], "the last page is held: not saved again"
    assert e.sched.scheduler._reqs["resident"].lookup.leases == {}, "nothing can load: nothing leased"
    assert e.sched.request_finished(r, a_blocks) == (False, None)

    # restored: the load covers three pages, the engine computes the fourth, held already
    b = Request("b", a.prompt_token_ids)
    n, _ = e.sched.get_num_new_matched_tokens(b, 0)
    assert n == 3 * PT
    b_blocks = list(range(10, 18))
    e.sched.update_state_after_alloc(b, (b_blocks,), n)
    e.step(SchedulerOutput())
    _, _, failed, errs = e.idle_until(lambda s, r: "b" in r)
    assert not failed and not errs
    e.sched.update_state_after_alloc(b, (b_blocks,), 0)
    so = SchedulerOutput([NewRequestData("b", b.prompt_token_ids, (b_blocks,), 3 * PT)], num_scheduled_tokens={"b": PT})
    meta, _, _ = e.step(so)
    assert meta.saves == [], "neither restored pages nor the held last page are saved again"
    assert e.sched.request_finished(b, b_blocks) == (False, None)

    # a prompt sharing three pages whose whole last page the peer lacks: that page is saved
    c = Request("c", a.prompt_token_ids[: 3 * PT] + list(range(7000, 7000 + PT)))
    assert e.sched.get_num_new_matched_tokens(c, 4 * PT - BS) == (0, False)
    c_blocks = list(range(20, 28))
    e.sched.update_state_after_alloc(c, (c_blocks,), 0)
    so = SchedulerOutput([NewRequestData("c", c.prompt_token_ids, (c_blocks,), 4 * PT - BS)], num_scheduled_tokens={"c": BS})
    meta, _, _ = e.step(so)
    assert [(s.first_page, len(s.blocks)) for s in meta.saves] == [(3, 1)]


def test_corrupt_page_reports_block_errors(engine):
    e, peer = engine
    if peer.kind != "fake":
        pytest.skip("fault injection needs the fake peer")
    a = Request("a", list(range(1000, 1000 + 3 * PT + 1)))
    _compute_and_save(e, a, list(range(0, 7)))
    from orbitkv import keys

    ks = keys.chain(e.sched.cfg.layout.fingerprint(), PT, a.prompt_token_ids)
    peer.fake.corrupt.add(ks[1])
    b = Request("b", a.prompt_token_ids)
    n, _ = e.sched.get_num_new_matched_tokens(b, 0)
    assert n == 3 * PT
    b_blocks = list(range(20, 27))
    e.sched.update_state_after_alloc(b, (b_blocks,), n)
    e.step(SchedulerOutput())
    _, recving, failed, errs = e.idle_until(lambda s, r: "b" in r)
    assert not failed  # per block only: failed_recving makes vLLM 0.33 recompute the whole request
    # page 1's blocks and those of every page after it; page 0 (before it) stays loaded
    assert errs == {22, 23, 24, 25}, "the blocks from page 1 on failed; vLLM recomputes from there"


def test_chunked_prefill_saves_incrementally_and_preemption_flushes(engine):
    e, peer = engine
    a = Request("a", list(range(2000, 2000 + 4 * PT)))
    blocks = list(range(0, 8))
    assert e.sched.get_num_new_matched_tokens(a, 0) == (0, False)
    e.sched.update_state_after_alloc(a, (blocks[:4],), 0)
    so = SchedulerOutput([NewRequestData("a", a.prompt_token_ids, (blocks[:4],), 0)], num_scheduled_tokens={"a": 2 * PT})
    meta, _, _ = e.step(so)
    assert [len(s.blocks) for s in meta.saves] == [2]
    cached = CachedRequestData(["a"], [(blocks[4:],)], [2 * PT])
    meta, _, _ = e.step(SchedulerOutput(scheduled_cached_reqs=cached, num_scheduled_tokens={"a": 2 * PT}))
    assert [s.first_page for s in meta.saves] == [2] and len(meta.saves[0].blocks) == 2
    meta, _, _ = e.step(SchedulerOutput(preempted_req_ids={"a"}))
    assert meta.preempted == ["a"]
    assert all(f.done() for f in e.work.worker._saves["a"])
    assert e.sched.request_finished(a, [])[0] is True
    e.idle_until(lambda s, r: "a" in s, finished=["a"])


# vLLM-like sizes: 64-token pages of four 16-token blocks.
PT64, BS16, NB64 = 64, 16, 40


@pytest.fixture
def engine64(peer):
    with shm_pool(pool_bytes(L, NB64, BS16, H, D)) as (path, pool):
        e = Engine(peer.socket, flash_layers(pool, L, NB64, BS16, H, D), pt=PT64, bs=BS16)
        yield e, peer
        e.close()


def _partial_hit(e, base):
    """Saves 4 pages of a prompt, then admits a request sharing them whose
    first 48 tokens (3 of page 0's 4 blocks) vLLM already computed."""
    a = Request("a", list(range(base, base + 4 * PT64 + 1)))
    a_blocks = list(range(0, 17))
    _compute_and_save(e, a, a_blocks, pt=PT64)
    b = Request("b", a.prompt_token_ids[: 4 * PT64] + [7, 7, 7])
    b_blocks = list(range(20, 37))
    for t in e.kv.values():  # the locally computed blocks: not bit-identical to the saved ones
        t[:, b_blocks[:3]] = torch.randn(t[:, b_blocks[:3]].shape)
    return a, a_blocks, b, b_blocks


def test_partial_local_hit_loads_rest_of_page_and_skips_local_blocks(engine64):
    e, peer = engine64
    a, a_blocks, b, b_blocks = _partial_hit(e, 3000)
    local = e.blocks_bytes(b_blocks[:3])
    n, is_async = e.sched.get_num_new_matched_tokens(b, 48)
    assert (n, is_async) == (16 + 3 * PT64, True), "the rest of page 0, then pages 1..3"
    e.sched.update_state_after_alloc(b, (b_blocks,), n)
    c = Request("c", list(range(900, 900 + 2 * PT64)))
    assert e.sched.get_num_new_matched_tokens(c, 0) == (None, False), "the gate still holds admission"
    meta, _, _ = e.step(SchedulerOutput())
    (spec,) = meta.loads
    assert spec.first_page == 0 and spec.skip_blocks == 3 and len(spec.blocks) == 4
    _, recving, failed, errs = e.idle_until(lambda s, r: "b" in r)
    assert not failed and not errs
    assert e.blocks_bytes(b_blocks[:3]) == local, "locally computed blocks were overwritten"
    assert e.blocks_bytes(b_blocks[3:16]) == e.blocks_bytes(a_blocks[3:16])
    so = SchedulerOutput([NewRequestData("b", b.prompt_token_ids, (b_blocks,), 4 * PT64)], num_scheduled_tokens={"b": 3})
    meta, _, _ = e.step(so)
    assert meta.saves == [], "restored pages are not saved again"
    assert e.sched.get_num_new_matched_tokens(c, 0) == (0, False)
    assert e.sched.request_finished(b, b_blocks) == (False, None)


def test_partial_local_hit_misaligned_or_covered(engine64):
    e, _ = engine64
    a, _, b, _ = _partial_hit(e, 4000)
    assert e.sched.get_num_new_matched_tokens(b, 40) == (0, False), "not block-aligned: no external hit"
    n, _ = e.sched.get_num_new_matched_tokens(b, PT64 + 16)
    assert n == 3 * PT64 - 16, "a partial hit inside a later page"
    assert e.sched.get_num_new_matched_tokens(Request("d", b.prompt_token_ids), 4 * PT64) == (0, False)


def test_partial_local_hit_load_error_spares_local_blocks(engine64):
    e, peer = engine64
    if peer.kind != "fake":
        pytest.skip("fault injection needs the fake peer")
    from orbitkv import keys

    a, _, b, b_blocks = _partial_hit(e, 5000)
    peer.fake.corrupt.add(keys.chain(e.sched.cfg.layout.fingerprint(), PT64, a.prompt_token_ids)[0])
    n, _ = e.sched.get_num_new_matched_tokens(b, 48)
    e.sched.update_state_after_alloc(b, (b_blocks,), n)
    e.step(SchedulerOutput())
    _, _, failed, errs = e.idle_until(lambda s, r: "b" in r)
    assert not failed  # per block only: failed_recving makes vLLM 0.33 recompute the whole request
    # page 0's loaded block and every page after it; the local ones stay valid
    assert errs == set(b_blocks[3:16]), "the local blocks were reported failed"


def test_pages_past_the_requests_publishable_block_hashes_are_not_saved(engine):
    """vLLM (after 0.33) tells a content-addressed connector how many of a
    request's block hashes it may publish (num_publishable_block_hashes);
    pages past them are not saved, and a request without it saves every
    whole page."""
    e, _ = engine
    capped = Request("capped", list(range(1000, 1000 + 3 * PT)))
    capped.num_publishable_block_hashes = (PT + PT // 2) // BS  # 1.5 pages of blocks: page 1 is not whole
    blocks = list(range(0, 3 * PT // BS))
    assert e.sched.get_num_new_matched_tokens(capped, 0) == (0, False)
    e.sched.update_state_after_alloc(capped, (blocks,), 0)
    so = SchedulerOutput([NewRequestData("capped", capped.prompt_token_ids, (blocks,), 0)],
                         num_scheduled_tokens={"capped": 3 * PT})
    meta, _, _ = e.step(so)
    assert [len(s.blocks) for s in meta.saves] == [1]
