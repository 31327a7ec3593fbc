"""The P/D handoff probe (orbitkv.refengine.pdprobe, scripts/gpu/pd.sh): its sample checks,
pure, and the router flow against a tiny reference engine as kv_producer and one as
kv_consumer on one real peer (the one-GPU layout of the H200 run, on the CPU)."""

import json

import pytest

from orbitkv.refengine import pdprobe
from tests.fixtures import start_real_peer, start_refengine, stop_real_peer

PT = 64


def _rep(promised=PT * 3, restored=PT * 3, cold=0, p_tok=5, c_tok=5, params=None):
    return {"handoff": {"promised_tokens": promised, "restored_tokens": restored, "producer_token": p_tok,
                        "consumer_token": c_tok, "params": params or {"orbitkv_pages": 4}},
            "recompute": {"restored_tokens": cold}}


@pytest.mark.parametrize("rep,expect_match,want", [
    (_rep(), True, []),
    (_rep(restored=None), False, []),  # a server that does not say: nothing to check
    (_rep(restored=PT), False, ["restored 64 of 192"]),
    (_rep(promised=0), False, ["promised no pages"]),
    (_rep(cold=PT), False, ["not cold"]),
    (_rep(c_tok=6), False, []),
    (_rep(c_tok=6), True, ["first tokens differ"]),
], ids=["whole", "unknown", "partial", "no-pages", "warm-recompute", "differ-not-asked", "differ"])
def test_check(rep, expect_match, want):
    got = pdprobe.check(rep, expect_match)
    assert len(got) == len(want) and all(w in g for w, g in zip(want, got)), got


@pytest.mark.parametrize("params,n,want", [
    (None, 200, 0),
    ({"orbitkv_pages": 4, "orbitkv_page_tokens": PT}, 4 * PT, 3 * PT),  # the last token is computed
    ({"orbitkv_pages": 3, "orbitkv_page_tokens": PT}, 4 * PT + 1, 3 * PT),
    ({"orbitkv_pages": 4, "orbitkv_page_tokens": 0}, 4 * PT, 0),
    # a producer that hands over the whole prompt (its tail counted as a page)
    ({"orbitkv_pages": 4, "orbitkv_page_tokens": PT, "orbitkv_tail_tokens": 0}, 4 * PT, 4 * PT - 1),
    ({"orbitkv_pages": 5, "orbitkv_page_tokens": PT, "orbitkv_tail_tokens": 1}, 4 * PT + 1, 4 * PT),
    ({"orbitkv_pages": 4, "orbitkv_page_tokens": PT, "orbitkv_tail_tokens": 0}, 4 * PT + 1, 4 * PT),
])
def test_promised_tokens(params, n, want):
    assert pdprobe.promised_tokens(params, n) == want


def test_restored_from_usage_or_vllm_counter():
    assert pdprobe.restored({"orbitkv_restored_tokens": 7}, {}) == 7
    assert pdprobe.restored({"prompt_tokens_details": {"cached_tokens": 9}}, {}) == 9
    c = {'vllm:external_prefix_cache_hits_total{engine="0",model_name="m"}': 128.0}
    assert pdprobe.restored({}, c) == 128
    assert pdprobe.restored({}, {}) is None


@pytest.fixture
def pd_pair(tmpdir_short):
    peer = start_real_peer(tmpdir_short)
    args = ("--connector", "orbitkv", "--orbitkv-socket", peer.socket, "--page-tokens", str(PT))
    prod = start_refengine(tmpdir_short, "prefill", *args, "--kv-role", "kv_producer")
    cons = start_refengine(tmpdir_short, "decode", *args, "--kv-role", "kv_consumer",
                           "--connector-extra", '{"pd_wait_ms": 3000}')
    yield prod, cons
    for e in (cons, prod):
        e.stop()
    stop_real_peer(peer)


def test_probe_hands_off_through_one_peer(pd_pair, tmpdir_short, capsys):
    prod, cons = pd_pair
    out = f"{tmpdir_short}/pd.json"
    n = 5 * PT + 9
    rc = pdprobe.main(["--producer", prod.url, "--consumer", cons.url, "--consumer-metrics", cons.url + "/metrics",
                       "--prompt-tokens", str(n), "--reps", "2", "--vocab", "512", "--strict", "--expect-match",
                       "--json", out])
    table = capsys.readouterr().out
    assert rc == 0, table
    res = json.load(open(out))
    assert len(res["samples"]) == 2 and len(res["warmup"]) == 1 and not res["problems"]
    for rep in res["samples"]:
        h, r = rep["handoff"], rep["recompute"]
        # 5 pages and the 9-token tail: the whole prompt but its last token restored
        assert h["params"]["do_remote_prefill"] is True and h["params"]["orbitkv_pages"] == 6
        assert h["params"]["orbitkv_tail_tokens"] == 9
        assert h["restored_tokens"] == h["promised_tokens"] == n - 1
        assert h["counters"]["orbitkv_refengine_computed_prompt_tokens_total"] == 1
        assert r["restored_tokens"] == 0 and r["counters"]["orbitkv_refengine_computed_prompt_tokens_total"] == n
        assert 0 < h["handoff_s"] < h["pd_ttft_s"] and h["pd_ttft_s"] == pytest.approx(h["prefill_s"] + h["handoff_s"])
    assert "handoff/recompute" in table


def test_probe_refuses_a_producer_without_handoff_params(pd_pair, capsys):
    _, cons = pd_pair  # a kv_consumer returns no kv_transfer_params
    rc = pdprobe.main(["--producer", cons.url, "--consumer", cons.url, "--prompt-tokens", "100", "--reps", "1",
                       "--vocab", "512"])
    assert rc == 2 and "no handoff kv_transfer_params" in capsys.readouterr().err
