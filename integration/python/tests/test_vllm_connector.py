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


def _extra(socket):
    return {
        "socket": socket,
        "page_tokens": PT,
        "block_tokens": BS,
        "layout": {"model": "orbitkv/test", "revision": "r0", "dtype": "fp32", "num_layers": L,
                   "kv_heads": H, "head_dim": D, "tp_size": 1, "byte_layout": "vllm-flash"},
        "load_deadline_ms": 5000,
        "save_deadline_ms": 5000,
    }


class Engine:
    """The two connector halves plus the engine-side glue of one step."""

    def __init__(self, socket, kv):
        self.sched = OrbitKVConnector(_extra(socket), KVConnectorRole.SCHEDULER, None)
        self.work = OrbitKVConnector(_extra(socket), KVConnectorRole.WORKER, None)
        self.work.register_kv_caches(kv)
        self.kv = kv

    def step(self, so, finished=(), before_save=None):
        meta = self.sched.build_connector_meta(so)
        assert isinstance(meta, OrbitKVMetadata)
        self.work.bind_connector_metadata(meta)
        self.work.start_load_kv(None)
        if before_save:
            before_save()  # "the forward": writes KV into the blocks
        self.work.wait_for_save()
        res = self.work.get_transfer_results(set(finished))
        errs = self.work.get_block_ids_with_load_errors()
        self.work.clear_connector_metadata()
        self.sched.update_connector_output(KVConnectorOutput(res.finished_sending, res.finished_recving))
        return meta, res, errs

    def idle_until(self, pred, finished=(), timeout=10.0):
        deadline = time.monotonic() + timeout
        sending, recving, failed, errs = set(), set(), set(), set()
        first = True
        while time.monotonic() < deadline:
            _, res, e = self.step(SchedulerOutput(), finished if first else ())
            first = False
            sending |= res.finished_sending or set()
            recving |= res.finished_recving or set()
            failed |= res.failed_recving or set()
            errs |= e
            if pred(sending, recving):
                return sending, recving, failed, errs
            time.sleep(0.01)
        raise AssertionError("timed out waiting for connector results")

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


def _compute_and_save(e, req, blocks):
    n = len(req.prompt_token_ids)
    assert e.sched.get_num_new_matched_tokens(req, 0) == (0, False)
    e.sched.update_state_after_alloc(req, (blocks,), 0)
    so = SchedulerOutput([NewRequestData(req.request_id, req.prompt_token_ids, (blocks,), 0)], num_scheduled_tokens={req.request_id: n})

    def forward():
        for t in e.kv.values():
            t[:, blocks] = torch.randn(t[:, blocks].shape)

    meta, _, _ = e.step(so, before_save=forward)
    assert len(meta.saves) == 1 and len(meta.saves[0].blocks) == n // PT
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
    assert failed == {"b"}
    assert errs == {22, 23}, "the blocks of page 1 failed; vLLM recomputes from there"


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
