"""A resident prompt (vLLM's own prefix cache holds every page a hit could
load): its lookup only says which pages the peer holds, so it runs beside
vLLM's scheduling step instead of inside get_num_new_matched_tokens, and is
settled when the request is scheduled, before any of its pages is saved."""

from __future__ import annotations

import threading

from orbitkv import errors
from orbitkv.keys import Layout
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.scheduler import SchedulerHalf
from tests.vllm_fakes import DictLookup, NewRequestData, Request, SchedulerOutput

PT = BT = 64
LAYOUT = Layout("Qwen/Qwen3-8B", "b968826", "bf16", 36, 8, 128, 0, 1, PT, "vllm-flash")
N = 8192  # 128 whole pages
HELD = N - PT  # vLLM's own cache stops a block short: it computes the last token again


class GatedLookup(DictLookup):
    """A lookup that answers only once the test lets it (bounded), or fails."""

    def __init__(self) -> None:
        super().__init__()
        self.asked = threading.Event()
        self.go = threading.Event()
        self.fail: Exception | None = None

    def lookup(self, ks, **kw):
        self.asked.set()
        if not self.go.wait(10):
            raise errors.PeerTimeout("the test never let the lookup answer")
        if self.fail is not None:
            raise self.fail
        return super().lookup(ks, **kw)


def _conn() -> tuple[SchedulerHalf, GatedLookup, Request]:
    be = GatedLookup()
    conn = SchedulerHalf(ConnectorConfig("unused", LAYOUT, BT), be, clock=lambda: 0.0)
    req = Request("r", list(range(1, N + 1)))
    be.store_prefix(LAYOUT, req.prompt_token_ids)
    return conn, be, req


def _schedule(conn: SchedulerHalf, req: Request):
    blocks = list(range(N // BT))
    conn.update_state_after_alloc(req, (blocks,), 0)
    return conn.build_connector_meta(SchedulerOutput([NewRequestData("r", req.prompt_token_ids, (blocks,), HELD)],
                                                     num_scheduled_tokens={"r": N - HELD}))


def test_the_lookup_of_a_resident_prompt_does_not_hold_the_step():
    conn, be, req = _conn()
    assert conn.get_num_new_matched_tokens(req, HELD) == (0, False), "answered while the peer has not"
    assert be.asked.wait(5), "the lookup was asked, on the lookup thread"
    assert conn.get_num_new_matched_tokens(req, HELD) == (0, False)
    be.go.set()
    meta = _schedule(conn, req)
    assert meta.saves == [], "every page, the whole last one too, is held by the peer: none saved again"
    assert be.calls == 1, "asked once, however often vLLM visits the request before scheduling it"
    assert conn._reqs["r"].lookup.leases == {}, "nothing can load: nothing leased"
    conn.shutdown()


def test_a_resident_prompt_whose_lookup_failed_saves_its_pages():
    conn, be, req = _conn()
    be.fail = errors.PeerUnavailable("peer restarting")
    be.go.set()
    assert conn.get_num_new_matched_tokens(req, HELD) == (0, False)
    meta = _schedule(conn, req)
    assert sum(len(s.blocks) for s in meta.saves) == N // PT, "unknown to be held: every page is saved"
    conn.shutdown()


def test_a_prompt_the_engine_does_not_hold_whole_looks_up_in_the_step():
    conn, be, req = _conn()
    be.go.set()
    n, _ = conn.get_num_new_matched_tokens(req, HELD - PT)  # one page short: a hit can load it
    assert n == PT and be.calls == 1, "the hit is needed now: asked in the call"
    conn.shutdown()


def test_a_resident_visit_then_a_hit_uses_the_hits_lookup():
    """vLLM's cache lost a page between two visits of a request it could not
    schedule: the second visit's lookup (a hit, leased) is the one the step
    plans with; the resident one, still unsettled, is dropped."""
    conn, be, req = _conn()
    be.go.set()
    assert conn.get_num_new_matched_tokens(req, HELD) == (0, False)
    n, _ = conn.get_num_new_matched_tokens(req, HELD - PT)
    assert n == PT
    st = conn._reqs["r"]
    assert st.pending is None and st.lookup.leases, "the hit's leased lookup stands"
    leased = dict(st.lookup.leases)
    blocks = list(range(N // BT))
    conn.update_state_after_alloc(req, (blocks,), n)
    meta = conn.build_connector_meta(SchedulerOutput([NewRequestData("r", req.prompt_token_ids, (blocks,), HELD - PT)],
                                                     num_scheduled_tokens={"r": N - HELD}))
    assert [sp.leases for sp in meta.loads] == [leased], "the load carries the hit's lease"
    conn.shutdown()
