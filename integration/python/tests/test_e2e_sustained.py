"""The seeds' sustained mixed-prefix workload, scaled down for a CPU, driven by
`orbitkv bench serving --workload sustained` against the tiny reference
engine twice: native (no external cache) and with OrbitKV (the real peer).

Scaled down: 6 prepared prefixes of 128/256/512 tokens (1,792 tokens, 1, 3
and 7 restorable 64-token pages), 75% reuse, concurrency 4, a 10 s window
plus drain, 16 output tokens, the engine's KV pool capped at 1,024 tokens so
the prefixes do not stay resident. Each run must have 0 failed requests and
every reused prompt's output equal to its serial reference; with OrbitKV,
tokens are restored and the peer's gauges drain to 0. Throughputs are
printed, not asserted (benchmarks are not timed assertions).
"""

import json
import os
import subprocess

import pytest

from tests.fixtures import real_peer_bin, start_real_peer, start_refengine, wait_until
from tests.test_refengine import bit_exact

KV_TOKENS = 1024
WINDOW = "10s"
BENCH_DEADLINE_S = 120
DRAIN_GAUGES = ("orbitkv_fabric_leases", "orbitkv_fabric_query_bytes", "orbitkv_transfer_inflight_ops",
                "orbitkv_transfer_inflight_copies", "orbitkv_tiers_ssd_inflight")


def bench_binary() -> str:
    """bin/orbitkv with a `bench serving` subcommand; skips (saying why) only
    when the binary is absent or has no such subcommand."""
    binary = real_peer_bin()
    if binary is None:
        pytest.skip(f"ORBITKV_BIN is unset or not an executable file ({os.environ.get('ORBITKV_BIN', '')!r})")
    r = subprocess.run([binary, "bench", "serving", "-h"], capture_output=True, text=True, timeout=30)
    if 'unknown bench subcommand "serving"' in r.stdout + r.stderr:
        pytest.skip(f"{binary} has no `bench serving` subcommand yet (rebuild with `make build` once it lands)")
    return binary


def run_bench(binary, out_dir, endpoint, *extra):
    args = [binary, "bench", "serving", "--workload", "sustained", "--endpoint", endpoint,
            "--output", out_dir, "--vocab", "512", "--seed", "7", "--prefixes", "6",
            "--prefix-tokens", "128,256,512", "--reuse", "0.75", "--concurrency", "4",
            "--duration", WINDOW, "--output-tokens", "16", "--request-timeout", "60s",
            "--require-match", "--quiet", *extra]
    r = subprocess.run(args, capture_output=True, text=True, timeout=BENCH_DEADLINE_S)
    with open(os.path.join(out_dir, "summary.json")) as f:
        summary = json.load(f)
    with open(os.path.join(out_dir, "requests.jsonl")) as f:
        rows = [json.loads(l) for l in f if l.strip()]
    return r, summary, rows


def check_run(name, r, summary, rows):
    assert r.returncode == 0 and summary["status"] == "ok", (name, r.stdout, r.stderr, summary.get("reasons"))
    assert summary["failed"] == 0 and summary["completed"] == len(rows) > 0, (name, summary.get("first_errors"))
    reused = [x for x in rows if x["reuse"]]
    assert reused and all(x.get("match_reference") is True for x in reused), (name, summary.get("mismatch_list"))
    assert summary["mismatches"] == 0


@bit_exact
def test_sustained_mixed_prefixes_native_and_orbitkv(tmpdir_short):
    binary = bench_binary()
    engine_args = ("--kv-tokens", str(KV_TOKENS))
    results = {}

    eng = start_refengine(tmpdir_short, "native", *engine_args)
    try:
        results["native"] = run_bench(binary, os.path.join(tmpdir_short, "native"), eng.url,
                                      "--engine-metrics", eng.url + "/metrics")
    finally:
        eng.stop()
    check_run("native", *results["native"])

    peer = start_real_peer(tmpdir_short)
    eng = None
    try:
        eng = start_refengine(tmpdir_short, "orbitkv", *engine_args, "--connector", "orbitkv",
                              "--orbitkv-socket", peer.socket)
        results["orbitkv"] = run_bench(binary, os.path.join(tmpdir_short, "orbitkv"), eng.url,
                                       "--engine-metrics", eng.url + "/metrics",
                                       "--peer-metrics", f"http://{peer.metrics_addr}/metrics",
                                       "--drain-timeout", "20s")
        check_run("orbitkv", *results["orbitkv"])
        _, summary, rows = results["orbitkv"]
        assert summary.get("drained") is True
        m = wait_until(lambda: (lambda m: m if all(m.get(g, 0) == 0 for g in DRAIN_GAUGES) else None)(peer.metrics()),
                       20, "peer gauges at 0")
        restored = sum(x["restored_tokens"] for x in rows)
        assert restored > 0 and m["orbitkv_fabric_loaded_tokens_total"] >= restored
        em = eng.metrics()
        assert em["orbitkv_refengine_requests_running"] == em["orbitkv_refengine_requests_held"] == 0
    finally:
        if eng is not None:
            eng.stop()
        peer.stop()

    # Same seed, same request sequence: where both runs reached a request,
    # both engines answered it identically (references included).
    refs = {}
    for name in results:
        with open(os.path.join(tmpdir_short, name, "prefixes.jsonl")) as f:
            refs[name] = [json.loads(l)["reference"] for l in f if l.strip()]
    assert refs["native"] == refs["orbitkv"]
    by_index = [{x["index"]: x["output_text"] for x in results[n][2]} for n in ("native", "orbitkv")]
    common = by_index[0].keys() & by_index[1].keys()
    assert common and all(by_index[0][i] == by_index[1][i] for i in common)

    line = []
    for name, (_, s, rows) in results.items():
        line.append(f"{name}: {s['completed']} requests ({sum(x['reuse'] for x in rows)} reused) in {s['window_s']:.1f} s, "
                    f"{s['throughput_rps']:.1f} req/s, TTFT p50 {s['ttft_ms']['p50']:.1f} ms, "
                    f"restored {sum(x['restored_tokens'] for x in rows)} tokens, cached frac {s['cached_token_frac']:.2f}")
    ratio = results["orbitkv"][1]["throughput_rps"] / results["native"][1]["throughput_rps"]
    print("\n" + "\n".join(line) + f"\northroughput orbitkv/native {ratio:.2f}x")
