"""The engine's prefill rate learned from its steps (orbitkv.vllm.prefill_rate),
and the scheduler half sending it with its lookups so the peer can leave a
slow SSD's pages to recompute (the SSD run that served at 0.49x native)."""

from orbitkv.keys import Layout
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.prefill_rate import PrefillRate
from orbitkv.vllm.scheduler import SchedulerHalf
from tests.vllm_fakes import CachedRequestData, DictLookup, NewRequestData, Request, SchedulerOutput


_NOW: dict = {}


def _steps(r: PrefillRate, steps):
    """Plans steps on r, each ``dt`` after the previous one (time carries over between calls)."""
    t = _NOW.get(id(r), 0.0)
    for dt, tokens in steps:
        t += dt
        r.step(t, tokens)
    _NOW[id(r)] = t


def test_rate_is_prefill_tokens_over_step_time_after_warmup():
    r = PrefillRate(warmup=3)
    _steps(r, [(0, 8192), (0.4, 8192), (0.4, 8192)])
    assert r.rate is None  # two samples so far
    _steps(r, [(0.4, 8192)])
    assert abs(r.rate - 8192 / 0.4) < 1e-6


def test_decode_steps_and_idle_gaps_are_not_samples():
    r = PrefillRate(warmup=1)
    _steps(r, [(0, 8), (0.006, 8), (0.006, 8)])  # decode: one token per request
    assert r.rate is None
    _steps(r, [(0.006, 4096), (30.0, 4096)])  # the engine sat idle for 30 s after planning: not compute time
    assert r.rate is None
    _steps(r, [(0.2, 0)])
    assert abs(r.rate - 4096 / 0.2) < 1e-6


def test_rate_follows_a_slower_engine():
    r = PrefillRate(warmup=1, alpha=0.5)
    _steps(r, [(0, 8192), (0.25, 8192)])
    fast = r.rate
    _steps(r, [(1.0, 8192), (1.0, 8192), (1.0, 8192), (1.0, 8192)])
    assert r.rate < fast / 3 and r.rate > 8192 / 1.0


def _half(recompute=0):
    lay = Layout("m", "r", "bf16", 2, 2, 8, 0, 1, 64, "vllm-flash")
    cfg = ConnectorConfig(socket="/nowhere", layout=lay, block_tokens=16, recompute_tokens_per_s=recompute)
    clock = [0.0]
    half = SchedulerHalf(cfg, DictLookup(), clock=lambda: clock[0])
    return half, clock


def _prefill_steps(half, clock, n, tokens, dt):
    """n steps that each prefill a new `tokens`-token prompt, dt apart."""
    for i in range(n):
        clock[0] += dt
        rid = f"p{clock[0]}-{i}"
        half.get_num_new_matched_tokens(Request(rid, list(range(tokens))), 0)
        half.build_connector_meta(SchedulerOutput([NewRequestData(rid, list(range(tokens)), ([],), 0)],
                                                  num_scheduled_tokens={rid: tokens}))


def test_lookups_carry_the_measured_rate_once_known():
    half, clock = _half()
    prompt = list(range(300))
    half.get_num_new_matched_tokens(Request("a", prompt), 0)
    assert half.backend.rates == [0]  # nothing measured, nothing configured: the peer restores everything
    _prefill_steps(half, clock, 5, 4096, 0.25)  # five prefill steps of 4096 prompt tokens
    half.get_num_new_matched_tokens(Request("b", prompt), 0)
    assert abs(half.backend.rates[-1] - 4096 / 0.25) <= 1


def test_decode_tokens_do_not_count_as_prefill():
    """600 requests decoding schedule 600 tokens a step: that is no prefill rate."""
    half, clock = _half()
    ids = [f"d{i}" for i in range(600)]
    for rid in ids:
        half.get_num_new_matched_tokens(Request(rid, list(range(100))), 0)
    half.build_connector_meta(SchedulerOutput([NewRequestData(r, list(range(100)), ([],), 0) for r in ids],
                                              num_scheduled_tokens={r: 100 for r in ids}))
    for step in range(10):  # decode: one token each, 35 ms a step
        clock[0] += 0.035
        cr = CachedRequestData(req_ids=ids, new_block_ids=[None] * 600, num_computed_tokens=[100 + step] * 600)
        half.build_connector_meta(SchedulerOutput(scheduled_cached_reqs=cr, num_scheduled_tokens={r: 1 for r in ids}))
    assert half.prefill.rate is None


def test_the_configured_rate_stands_in_until_one_is_measured():
    half, _ = _half(recompute=25000)
    half.get_num_new_matched_tokens(Request("a", list(range(300))), 0)
    assert half.backend.rates == [25000]
