"""The restore admission gate: the pure state machine, and the five focused
cases of the seed (ready hit, miss, short prompt, compute completion,
cancellation with retained save holds) through the connector's scheduler half."""

import pytest

from orbitkv.gate import Admission, HoldState, RestoreGate
from orbitkv.keys import Layout
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.scheduler import SchedulerHalf
from tests.vllm_fakes import DictLookup, KVConnectorOutput, NewRequestData, Request, SchedulerOutput

PT, BS = 64, 16
LAYOUT = Layout("m", "r", "bf16", 2, 2, 8, 0, 1, PT, "vllm-flash")


def _sched(gate=True):
    cfg = ConnectorConfig(socket="unused", layout=LAYOUT, block_tokens=BS, gate=gate)
    be = DictLookup()
    return SchedulerHalf(cfg, be, clock=lambda: 0.0), be


def _req(rid, n, base=0):
    return Request(rid, [base + i for i in range(n)])


def _run_step(s, req, computed, scheduled, blocks):
    so = SchedulerOutput(
        scheduled_new_reqs=[NewRequestData(req.request_id, req.prompt_token_ids, (blocks,), computed)],
        num_scheduled_tokens={req.request_id: scheduled},
    )
    return s.build_connector_meta(so)


def test_pure_gate_lifecycle():
    g = RestoreGate()
    assert g.query("a") is Admission.PROCEED
    g.allocated("a", 128, now=1.0)
    assert g.query("b") is Admission.DEFER and g.query("a") is Admission.PROCEED
    g.load_finished("a")
    assert g.hold_state("a") is HoldState.LOADED and g.query("b") is Admission.DEFER
    g.allocated("a", 0, now=2.0)  # vLLM's second call after the async load
    assert g.query("b") is Admission.DEFER
    assert g.held_for(3.0) == 2.0
    g.computed("a")
    assert g.query("b") is Admission.PROCEED and g.holder() is None


def test_ready_hit_holds_gate_until_first_compute_not_copy_completion():
    s, be = _sched()
    a = _req("a", 4 * PT + 5)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    n, is_async = s.get_num_new_matched_tokens(a, 0)
    assert (n, is_async) == (4 * PT, True)
    blocks = list(range(17))
    s.update_state_after_alloc(a, (blocks,), n)
    meta = s.build_connector_meta(SchedulerOutput())
    assert len(meta.loads) == 1 and meta.loads[0].blocks[0] == (0, 1, 2, 3)
    b = _req("b", 2 * PT, base=10_000)
    assert s.get_num_new_matched_tokens(b, 0) == (None, False)
    s.update_connector_output(KVConnectorOutput(finished_recving={"a"}))
    assert s.gate.hold_state("a") is HoldState.LOADED
    assert s.get_num_new_matched_tokens(b, 0) == (None, False), "copy completion alone must not release"
    s.update_state_after_alloc(a, (blocks,), 0)
    _run_step(s, a, 4 * PT, 5, blocks)
    assert s.gate.holder() is None
    assert s.get_num_new_matched_tokens(b, 0) == (0, False)
    assert not be.leases, "the load's lease is released once the load ended"


def test_miss_does_not_take_gate():
    s, be = _sched()
    a = _req("a", 3 * PT)
    assert s.get_num_new_matched_tokens(a, 0) == (0, False)
    s.update_state_after_alloc(a, ([0, 1],), 0)
    assert s.gate.holder() is None
    assert s.get_num_new_matched_tokens(_req("b", 3 * PT, 500), 0) == (0, False)


def test_short_prompt_never_hits():
    s, be = _sched()
    a = _req("a", PT)  # exactly one page: the last token must be computed
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    assert s.get_num_new_matched_tokens(a, 0) == (0, False)
    assert s.get_num_new_matched_tokens(_req("b", PT - 1), 0) == (0, False)
    assert be.calls == 0
    c = _req("c", 2 * PT)  # two whole pages: only the first may be restored
    be.store_prefix(LAYOUT, c.prompt_token_ids)
    assert s.get_num_new_matched_tokens(c, 0) == (PT, True)


def test_compute_completion_plans_saves_and_releases():
    s, be = _sched()
    a = _req("a", 3 * PT + 1)
    assert s.get_num_new_matched_tokens(a, 0) == (0, False)
    blocks = list(range(13))
    s.update_state_after_alloc(a, (blocks,), 0)
    meta = _run_step(s, a, 0, 3 * PT + 1, blocks)
    assert [sp.first_page for sp in meta.saves] == [0] and len(meta.saves[0].blocks) == 3
    assert s.gate.has_save_holds("a")
    delay, _ = s.request_finished(a, blocks)
    assert delay is True
    s.update_connector_output(KVConnectorOutput(finished_sending={"a"}))
    assert not s.gate.has_save_holds("a")


def test_cancellation_releases_admission_but_keeps_save_holds():
    s, be = _sched()
    a = _req("a", 4 * PT + 1)
    be.store_prefix(LAYOUT, a.prompt_token_ids[: 2 * PT])  # two pages cached
    n, _ = s.get_num_new_matched_tokens(a, 0)
    assert n == 2 * PT
    blocks = list(range(17))
    s.update_state_after_alloc(a, (blocks,), n)
    s.gate.save_started("a")  # e.g. a save planned in an earlier life of the request
    b = _req("b", 2 * PT, 9000)
    assert s.get_num_new_matched_tokens(b, 0)[0] is None
    delay, _ = s.request_finished(a, blocks)  # cancelled before computing
    assert delay is True, "save holds keep the blocks"
    assert s.gate.holder() is None
    assert s.get_num_new_matched_tokens(b, 0) == (0, False)
    assert be.leases, "the lease of the in-flight load is kept until the load ends"
    s.update_connector_output(KVConnectorOutput(finished_recving={"a"}))
    assert not be.leases
    s.update_connector_output(KVConnectorOutput(finished_sending={"a"}))
    assert not s.gate.has_save_holds("a")


def test_local_hit_not_page_aligned_gets_the_rest_of_the_page():
    s, be = _sched()
    a = _req("a", 4 * PT + 1)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    assert s.get_num_new_matched_tokens(a, BS + 1) == (0, False), "not block-aligned"
    assert s.get_num_new_matched_tokens(a, PT) == (3 * PT, True)
    n, _ = s.get_num_new_matched_tokens(a, 3 * BS)  # 3 of page 0's 4 blocks are local
    assert n == BS + 3 * PT
    blocks = list(range(17))
    s.update_state_after_alloc(a, (blocks,), n)
    (spec,) = s._loads
    assert (spec.first_page, spec.skip_blocks, len(spec.blocks)) == (0, 3, 4)
    assert spec.loaded_blocks(0) == (3,) and spec.loaded_blocks(1) == (4, 5, 6, 7)
    assert s.gate.holder() == "a", "admission is taken as for a page-aligned hit"


@pytest.mark.parametrize("gate", [True, False])
def test_gate_off_never_defers(gate):
    s, be = _sched(gate=gate)
    a = _req("a", 2 * PT + 1)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    n, _ = s.get_num_new_matched_tokens(a, 0)
    s.update_state_after_alloc(a, (list(range(9)),), n)
    got = s.get_num_new_matched_tokens(_req("b", PT + 1, 777), 0)
    assert (got[0] is None) == gate


def test_queue_aware_gate_admits_misses_and_restores_that_fit():
    g = RestoreGate(skipped_first=True, capacity_blocks=40)
    assert g.queue_aware
    g.allocated("a", 1024, now=1.0, blocks=18)
    assert g.query("miss", 0) is Admission.PROCEED  # restores nothing: cannot stand in front of a holder
    assert g.query("b", 18) is Admission.PROCEED  # 36 of 40 blocks
    g.allocated("b", 1024, now=1.5, blocks=18)
    assert g.query("c", 18) is Admission.DEFER  # 54 > 40
    assert g.query("c", -1) is Admission.DEFER  # unknown size: a restore that does not fit
    g.computed("a", now=3.0)
    assert g.query("c", 18) is Admission.PROCEED
    assert (g.totals.restores, g.totals.deferred_restores, g.totals.deferred_misses, g.totals.max_holders) == (2, 2, 0, 2)
    assert g.totals.hold_s == 2.0
    st = g.take_stats()
    assert st.restores == 2 and g.stats.restores == 0 and g.stats.max_holders == 1 and g.totals.restores == 2


def test_strict_gate_defers_misses_too_and_without_a_capacity_stays_strict():
    for g in (RestoreGate(), RestoreGate(skipped_first=True), RestoreGate(capacity_blocks=99)):
        assert not g.queue_aware
        g.allocated("a", 64, now=0.0, blocks=4)
        assert g.query("miss", 0) is Admission.DEFER and g.query("b", 4) is Admission.DEFER
        assert g.totals.deferred_misses == 1 and g.totals.deferred_restores == 1


def test_gate_mode_needs_vllm_026_fcfs_and_a_known_cache():
    from types import SimpleNamespace as NS

    from orbitkv.vllm.connector import gate_mode

    cfg = lambda policy: NS(scheduler_config=NS(policy=policy))  # noqa: E731
    kvc = NS(num_blocks=1025)
    assert gate_mode(cfg("fcfs"), kvc, "0.26.0") == {"skipped_first": True, "capacity_blocks": 1024}
    assert gate_mode(cfg("priority"), kvc, "0.26.0") == {}
    assert gate_mode(cfg("fcfs"), kvc, "0.25.1") == {}
    assert gate_mode(cfg("fcfs"), None, "0.26.0") == {}
    assert gate_mode(cfg("fcfs"), kvc, "") == {}


def test_gate_stats_aggregate_and_reduce_for_vllms_log():
    from orbitkv.gate import GateStats
    from orbitkv.vllm.stats import OrbitKVStats

    a = OrbitKVStats.of(GateStats(restores=2, hold_s=0.5, deferred_restores=1, max_holders=2), {"delayed_frees": 3})
    b = OrbitKVStats.of(GateStats(restores=2, hold_s=0.3, deferred_misses=4, max_holders=3),
                        {"delayed_frees": 1, "early_frees": 2, "flushes": 1})
    r = a.aggregate(b).reduce()
    assert r == {"orbitkv_restores": 4, "orbitkv_gate_hold_ms_avg": 200.0, "orbitkv_gate_deferred_restores": 1,
                 "orbitkv_gate_deferred_misses": 4, "orbitkv_gate_deferred_budget": 0, "orbitkv_gate_max_holders": 3,
                 "orbitkv_delayed_frees": 4, "orbitkv_early_frees": 2, "orbitkv_flushes": 1}
    assert OrbitKVStats.of(GateStats()).is_empty() and not a.is_empty()


def _queue_aware(budget_pages=0):
    cfg = ConnectorConfig(socket="unused", layout=LAYOUT, block_tokens=BS)
    be = DictLookup()
    be.budget_pages = budget_pages
    return SchedulerHalf(cfg, be, clock=lambda: 0.0, skipped_first=True, capacity_blocks=64), be


def _admit(s, r, blocks):
    n, _ = s.get_num_new_matched_tokens(r, 0)
    s.update_state_after_alloc(r, (blocks,), n)
    return n


def test_a_deferred_request_holds_no_lease_and_asks_again_only_after_a_release():
    s, be = _sched()  # strict: the second restore is deferred
    a, b = _req("a", 4 * PT + 5), _req("b", 4 * PT + 5, base=50_000)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    be.store_prefix(LAYOUT, b.prompt_token_ids)
    assert _admit(s, a, list(range(17))) == 4 * PT
    calls = be.calls
    assert s.get_num_new_matched_tokens(b, 0) == (None, False)
    assert len(be.leases) == 1  # a's; b's lease went back with the deferral
    for _ in range(5):  # later steps: still deferred, without another lookup
        assert s.get_num_new_matched_tokens(b, 0) == (None, False)
    assert be.calls == calls + 1
    s.gate.computed("a")  # a's hold released: b looks up again and restores
    assert s.get_num_new_matched_tokens(b, 0) == (4 * PT, True) and be.calls == calls + 2


def test_a_hit_cut_by_the_query_budget_waits_for_other_restores_then_restores_whole():
    s, be = _queue_aware(budget_pages=6)  # room for one 4-page restore, not two
    a, b = _req("a", 4 * PT + 5), _req("b", 4 * PT + 5, base=50_000)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    be.store_prefix(LAYOUT, b.prompt_token_ids)
    assert _admit(s, a, list(range(17))) == 4 * PT  # a holds 4 of the 6 pages of budget
    assert s.get_num_new_matched_tokens(b, 0) == (None, False)  # only 2 pages would fit: wait
    assert s.gate.totals.deferred_budget == 1 and len(be.leases) == 1
    s.update_connector_output(KVConnectorOutput(finished_recving={"a"}))  # a's load ends, its lease goes
    s.gate.computed("a")
    assert s.get_num_new_matched_tokens(b, 0) == (4 * PT, True)


def test_a_budget_cut_hit_with_no_other_restore_takes_what_it_got():
    s, be = _queue_aware(budget_pages=2)
    a = _req("a", 4 * PT + 5)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    assert s.get_num_new_matched_tokens(a, 0) == (2 * PT, True)  # nothing to wait for


def test_pages_in_vllms_own_cache_take_no_query_budget():
    """A request whose first 4 pages vLLM still holds (its prefix cache) looks
    up with lease_from 4: the lease, and the query budget, take only the 4
    pages it restores, so two such restores fit an 8-page budget side by side
    (leasing from page 0, the first took all 8 and the second was cut to
    nothing). A
    later call with fewer pages held locally looks up again: its lease must
    cover them."""
    cfg = ConnectorConfig(socket="unused", layout=LAYOUT, block_tokens=BS)
    be = DictLookup()
    be.budget_pages = 8
    s = SchedulerHalf(cfg, be, clock=lambda: 0.0, skipped_first=True, capacity_blocks=128)  # both prompts' blocks fit
    a, b = _req("a", 8 * PT + 5), _req("b", 8 * PT + 5, base=50_000)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    be.store_prefix(LAYOUT, b.prompt_token_ids)
    assert s.get_num_new_matched_tokens(a, 4 * PT) == (4 * PT, True)  # pages 4..7 from the peer
    s.update_state_after_alloc(a, (list(range(33)),), 4 * PT)
    assert s.get_num_new_matched_tokens(b, 4 * PT) == (4 * PT, True)  # fits beside a's
    assert be.lease_froms[-2:] == [4, 4] and sum(be._held.values()) == 8 and s.gate.totals.deferred_budget == 0
    calls = be.calls
    assert s.get_num_new_matched_tokens(b, 2 * PT) == (None, False)  # 6 pages to lease, 4 free: waits for a
    assert be.calls == calls + 1 and be.lease_froms[-1] == 2  # looked up again from page 2


def test_a_hit_vllm_holds_whole_is_asked_again_after_the_refresh_time():
    """A hit that vLLM's own cache holds whole takes no lease, so no lease
    expiry ends its cached lookup: like a miss, it is trusted for
    lookup_refresh_s, then asked again, and pages saved meanwhile restore."""
    now = [0.0]
    cfg = ConnectorConfig(socket="unused", layout=LAYOUT, block_tokens=BS)
    be = DictLookup()
    s = SchedulerHalf(cfg, be, clock=lambda: now[0], skipped_first=True, capacity_blocks=128)
    a = _req("a", 8 * PT + 5)
    be.store_prefix(LAYOUT, a.prompt_token_ids[: 4 * PT])  # the 4 pages vLLM holds too
    assert s.get_num_new_matched_tokens(a, 4 * PT) == (0, False) and not be.leases
    s.update_state_after_alloc(a, ([],), 0)  # vLLM had no blocks: a waits
    be.store_prefix(LAYOUT, a.prompt_token_ids)  # another engine saved the rest
    now[0] += cfg.lookup_refresh_s / 2
    assert s.get_num_new_matched_tokens(a, 4 * PT) == (0, False)  # still the cached answer
    now[0] += cfg.lookup_refresh_s
    assert s.get_num_new_matched_tokens(a, 4 * PT) == (4 * PT, True)


def _budget_pair(budget_pages, a_pages, b_pages, clock):
    """A queue-aware scheduler half over a peer with a query budget of budget_pages, and two
    requests a and b whose first a_pages / b_pages pages the peer holds."""
    cfg = ConnectorConfig(socket="unused", layout=LAYOUT, block_tokens=BS)
    be = DictLookup()
    be.budget_pages = budget_pages
    s = SchedulerHalf(cfg, be, clock=clock, skipped_first=True, capacity_blocks=64)
    a, b = _req("a", a_pages * PT + 5), _req("b", b_pages * PT + 5, base=50_000)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    be.store_prefix(LAYOUT, b.prompt_token_ids)
    return s, be, a, b


def test_a_hit_cut_by_a_waiting_requests_lease_waits_a_bounded_time():
    """a looked up (its lease pins 4 of the 6 pages of budget) but vLLM had no
    blocks for it yet: it holds no admission, so no release would end b's
    deferral. b, cut to 2 pages, waits anyway, asks again every
    BUDGET_RETRY_S, restores whole once a's lease is gone, and never waits
    longer than BUDGET_WAIT_S (on the H200 such cuts left 10,000 pages a
    minute to recompute: docs/benchmarks.md)."""
    from orbitkv.vllm import scheduler as sched

    now = [0.0]
    s, be, a, b = _budget_pair(6, 4, 4, lambda: now[0])
    assert s.get_num_new_matched_tokens(a, 0) == (4 * PT, True)  # looked up; not allocated (no blocks)
    assert s.get_num_new_matched_tokens(b, 0) == (None, False)
    assert s.gate.totals.deferred_budget == 1 and len(be.leases) == 1  # b gave its lease back
    calls = be.calls
    now[0] += sched.BUDGET_RETRY_S / 2
    assert s.get_num_new_matched_tokens(b, 0) == (None, False) and be.calls == calls  # no new lookup yet
    now[0] += sched.BUDGET_RETRY_S
    assert s.get_num_new_matched_tokens(b, 0) == (None, False) and be.calls == calls + 1  # asked again: still cut
    s.request_finished(a)  # a cancelled: its lease goes
    now[0] += sched.BUDGET_RETRY_S
    assert s.get_num_new_matched_tokens(b, 0) == (4 * PT, True)  # whole


def test_a_budget_cut_behind_a_waiting_lease_stops_waiting_after_the_bound():
    from orbitkv.vllm import scheduler as sched

    now = [0.0]
    s, be, a, b = _budget_pair(6, 4, 4, lambda: now[0])
    assert s.get_num_new_matched_tokens(a, 0) == (4 * PT, True)  # a waits for blocks, lease held throughout
    assert s.get_num_new_matched_tokens(b, 0) == (None, False)
    got = None
    for _ in range(100):
        now[0] += sched.BUDGET_RETRY_S
        got = s.get_num_new_matched_tokens(b, 0)
        if got != (None, False):
            break
    assert got == (2 * PT, True)  # took the cut hit
    assert sched.BUDGET_WAIT_S <= now[0] <= sched.BUDGET_WAIT_S + 2 * sched.BUDGET_RETRY_S  # after the bound, not before


def test_a_budget_cut_the_other_leases_could_not_explain_takes_the_hit_at_once():
    """b's cut (6 pages) is more than a's lease holds (2): waiting for a would
    not make room, so b takes what it got without deferring."""
    s, be, a, b = _budget_pair(8, 2, 12, lambda: 0.0)
    assert s.get_num_new_matched_tokens(a, 0) == (2 * PT, True)  # a waits for blocks with 2 pages leased
    assert s.get_num_new_matched_tokens(b, 0) == (6 * PT, True)  # cut by 6 > the 2 a holds: no wait
    assert s.gate.totals.deferred_budget == 0


def test_a_budget_cut_behind_restores_holding_admission_waits_at_most_the_bound():
    """Behind a restore holding admission a cut hit waits for its release, but not for
    ever: with holds that never end it takes the cut hit after BUDGET_WAIT_S."""
    from orbitkv.vllm import scheduler as sched

    now = [0.0]
    s, be, a, b = _budget_pair(6, 4, 4, lambda: now[0])
    assert _admit(s, a, list(range(17))) == 4 * PT  # a holds admission (and 4 of 6 pages) throughout
    assert s.get_num_new_matched_tokens(b, 0) == (None, False)
    s.gate.epoch += 1  # holds released and retaken elsewhere: b asks again, still cut
    now[0] += sched.BUDGET_WAIT_S / 2
    assert s.get_num_new_matched_tokens(b, 0) == (None, False)
    s.gate.epoch += 1
    now[0] += sched.BUDGET_WAIT_S
    assert s.get_num_new_matched_tokens(b, 0) == (2 * PT, True)  # past the bound: takes the cut hit


def test_a_sync_load_built_before_the_previous_step_was_reported_keeps_its_failure():
    """vLLM's async scheduling builds step N+1 before it reports step N. A
    sync load planned into N+1 runs in N+1 and its failed blocks come with
    N+1's report: N's report must not forget it, or the failed page is
    offered again as if it had loaded."""
    cfg = ConnectorConfig(socket="unused", layout=LAYOUT, block_tokens=BS, async_load=False, gate=False)
    be = DictLookup()
    s = SchedulerHalf(cfg, be, clock=lambda: 0.0)
    a, b = _req("a", 2 * PT + 5), _req("b", 2 * PT + 5, base=50_000)
    be.store_prefix(LAYOUT, a.prompt_token_ids)
    be.store_prefix(LAYOUT, b.prompt_token_ids)
    a_blocks, b_blocks = list(range(1, 10)), list(range(20, 29))
    for r, blocks in ((a, a_blocks), (b, b_blocks)):
        n, is_async = s.get_num_new_matched_tokens(r, 0)
        assert (n, is_async) == (2 * PT, False)
        s.update_state_after_alloc(r, (blocks,), n)
        assert [sp.req_id for sp in s.build_connector_meta(SchedulerOutput()).loads] == [r.request_id]
    s.update_connector_output(KVConnectorOutput())  # step N (a's load): fine
    s.update_connector_output(KVConnectorOutput(invalid_block_ids={b_blocks[4]}))  # step N+1: b's page 1 failed
    assert s._reqs["b"].failed_at == 1 and s._reqs["a"].failed_at is None
