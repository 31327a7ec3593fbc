"""P/D roles (orbitkv.vllm.pd): the handoff wait as a pure state machine, the
role config, and a prefill engine (kv_producer) handing a prompt to a decode
engine (kv_consumer) through one real peer, in the reference engine. The
same handoff across three hosts (network namespaces) is
integration/e2e/pd_test.go."""

import time

import pytest

from orbitkv.refengine.engine import Engine
from orbitkv.vllm import pd
from orbitkv.vllm.config import load_config
from tests.test_refengine import bit_exact
from tests.test_refengine_connector import PT, _orbitkv, prompts, recompute, tiny


# --- the wait, pure ------------------------------------------------------------------------------

def test_handoff_wait_backs_off_and_proceeds_when_complete():
    w = pd.HandoffWait(expect=4, deadline=10.0)
    times, now = [], 0.0
    for hit in (0, 1, 2, 3):
        assert w.due(now)
        assert w.observe(now, hit) == pd.Decision.WAIT
        assert not w.due(w.next_poll - 1e-9)
        times.append(w.interval)
        now = w.next_poll
    assert times == pytest.approx([w.first_s, 2 * w.first_s, 4 * w.first_s, 8 * w.first_s])
    assert w.observe(now, 4) == pd.Decision.PROCEED


def test_handoff_wait_proceeds_at_its_deadline_and_never_polls_past_it():
    w = pd.HandoffWait(expect=4, deadline=1.0, max_s=0.3)
    now = 0.0
    while w.observe(now, 1) == pd.Decision.WAIT:
        assert w.next_poll <= w.deadline and w.interval <= 0.3
        now = w.next_poll
    assert now == 1.0 and w.best == 1


@pytest.mark.parametrize("params,want", [
    (None, 0), ({}, 0), ({"do_remote_prefill": False, pd.PAGES: 3}, 0),
    ({"do_remote_prefill": True}, 0), ({"do_remote_prefill": True, pd.PAGES: 3}, 3),
    ({"do_remote_prefill": True, pd.PAGES: "x"}, 0), ({"do_remote_prefill": True, pd.PAGES: -2}, 0),
])
def test_expected_pages(params, want):
    assert pd.expected_pages(params) == want


class _Req:
    def __init__(self, rid, n, params):
        self.request_id, self.prompt_token_ids, self.kv_transfer_params = rid, list(range(n)), params


def test_handoffs_poll_until_the_pages_show_then_proceed():
    now = [0.0]
    visible = [0]
    polls = []

    def peek(req, n):
        polls.append(now[0])
        return min(visible[0], n)

    h = pd.Handoffs(wait_ms=1000, page_tokens=16, peek=peek, clock=lambda: now[0])
    r = _Req("a", 70, {"do_remote_prefill": True, pd.PAGES: 9})  # 70 tokens: at most 4 pages to load
    assert h.should_wait(r)
    for _ in range(5):
        now[0] += 0.001
        assert h.should_wait(r)
    assert len(polls) < 6  # backed off: not one lookup per step
    visible[0] = 4
    now[0] += 1.0 - now[0] - 0.01
    assert not h.should_wait(r) and h.completed == 1 and h.waiting == 0
    assert not h.should_wait(_Req("b", 70, None))  # not a handoff: no wait, no lookup
    assert h.timed_out == 0


def test_handoffs_give_up_at_the_deadline():
    now = [0.0]
    h = pd.Handoffs(wait_ms=200, page_tokens=16, peek=lambda r, n: 1, clock=lambda: now[0])
    r = _Req("a", 70, {"do_remote_prefill": True, pd.PAGES: 4})
    while h.should_wait(r):
        now[0] += 0.01
        assert now[0] < 1
    assert now[0] >= 0.2 and h.timed_out == 1


def test_handoff_params_name_the_producer():
    p = pd.handoff_params("prefill-0", 5, 64, {"name": "host-a", "data_addr": "10.0.0.1:7948"}, [3, 4])
    assert p["do_remote_prefill"] and not p["do_remote_decode"]
    assert (p["remote_host"], p["remote_port"], p["remote_engine_id"]) == ("10.0.0.1", 7948, "prefill-0")
    assert (p[pd.PAGES], p[pd.MEMBER], p["remote_block_ids"]) == (5, "host-a", [3, 4])
    assert pd.handoff_params("e", 1, 64, None)["remote_host"] == ""


@pytest.mark.parametrize("extra,want", [({}, "kv_both"), ({"kv_role": "kv_consumer"}, "kv_consumer"),
                                        ({"kv_role": "kv_producer"}, "kv_producer")])
def test_kv_role_config(extra, want):
    cfg = load_config({"socket": "/x", **extra})
    assert cfg.kv_role == want and cfg.saves == (want != "kv_consumer")


def test_kv_role_from_vllms_kv_transfer_config():
    import types
    vc = types.SimpleNamespace(kv_transfer_config=types.SimpleNamespace(
        kv_role="kv_consumer", kv_connector_extra_config={"socket": "/x", "pd_wait_ms": 50}))
    cfg = load_config(vc)
    assert (cfg.kv_role, cfg.pd_wait_ms, cfg.saves) == ("kv_consumer", 50, False)


@pytest.mark.parametrize("extra", [{"kv_role": "kv_decoder"}, {"pd_wait_ms": -1}])
def test_bad_role_config_is_refused(extra):
    with pytest.raises(ValueError):
        load_config({"socket": "/x", **extra})


# --- two engines, one real peer --------------------------------------------------------------------

def _saved(peer):
    return peer.metrics().get("orbitkv_fabric_saved_pages_total", 0)


def _handoff(e, prompt, params, max_tokens):
    r = e.add_request(prompt, max_tokens, kv_transfer_params=params)
    for _ in range(HANDOFF_STEPS):  # steps, never a time budget: idle steps wait for a transfer
        if not e.has_work():
            return r
        e.step()
        if e.last_step_tokens == 0:
            e.wait_idle()
    raise AssertionError(f"the handoff did not finish in {HANDOFF_STEPS} steps")


HANDOFF_STEPS = 100_000  # a consumer's pd_wait_ms polls are idle steps of 1 ms


@bit_exact
def test_producer_hands_a_prompt_to_a_consumer(real_peer):
    ps = prompts(2, 70, seed=21)
    want = recompute(ps, 6)
    outs = []
    with Engine(tiny(), _orbitkv(real_peer.socket, kv_role="kv_producer", engine_id="prefill")) as prod:
        for p in ps:
            r = _handoff(prod, p, {"do_remote_decode": True}, 1)
            assert r.output_token_ids == want[ps.index(p)][:1]
            outs.append(r.kv_transfer_params_out)
        assert prod.stats()["kv_blocks_free"] == prod.stats()["kv_blocks_total"]  # freed once saved
    for params in outs:
        # 4 whole pages and the 6-token tail: the whole prompt (docs/pd.md)
        assert params["do_remote_prefill"] and params[pd.PAGES] == 70 // PT + 1 and params[pd.TAIL_TOKENS] == 70 % PT
        assert params["remote_engine_id"] == "prefill"
    saved = _saved(real_peer)
    assert saved == 2 * (70 // PT + 1)
    with Engine(tiny(), _orbitkv(real_peer.socket, kv_role="kv_consumer", pd_wait_ms=5000)) as cons:
        got = [_handoff(cons, p, params, 6).output_token_ids for p, params in zip(ps, outs)]
        st = cons.stats()
        ho = cons.connector_scheduler.handoffs
    assert got == want
    assert st["external_restored_tokens"] == 2 * 69  # the whole prompt but the last token, each
    assert (ho.completed, ho.timed_out) == (2, 0)
    assert _saved(real_peer) == saved  # a consumer never saves


@bit_exact
def test_consumer_recomputes_after_its_wait_when_pages_never_come(real_peer):
    p = prompts(1, 70, seed=22)[0]
    want = recompute([p], 6)[0]
    params = pd.handoff_params("gone", 4, PT, None)  # a producer that died before saving
    with Engine(tiny(), _orbitkv(real_peer.socket, kv_role="kv_consumer", pd_wait_ms=300)) as cons:
        t0 = time.monotonic()
        r = _handoff(cons, p, params, 6)
        took = time.monotonic() - t0
        ho = cons.connector_scheduler.handoffs
        st = cons.stats()
    assert r.output_token_ids == want
    assert took >= 0.3 and (ho.completed, ho.timed_out) == (0, 1)
    assert st["external_restored_tokens"] == 0 and _saved(real_peer) == 0


def test_own_member_of_a_standalone_peer_is_asked_once(real_peer):
    assert pd.own_member(real_peer.socket, 2.0) == {}  # answered: standalone, no member entry
    assert pd.own_member(real_peer.socket + ".absent", 0.2) is None  # not answered: ask again later
