"""End to end with separate processes: the real peer binary (ORBITKV_BIN, DRAM
+ SSD tiers in a temp data dir) and the tiny reference engine serving HTTP
with the OrbitKV connector saving with SSD durability.

A prompt is sent, pushed out of the engine's small KV pool by a filler, and
sent again: the second time its whole pages come back from OrbitKV (the
peer's loaded-token counter and the response's usage say so) and the output
equals a full recompute. Then the peer is killed: a request while it is down
is recomputed (no hang), and after the peer restarts on the same data dir the
engine's sessions reopen by themselves and the SSD-resident prefix is
restored again.
"""

import json
import os
import random
import time

import pytest

from orbitkv.refengine import PRESETS, engine_config
from orbitkv.refengine.engine import Engine
from tests.fixtures import start_real_peer, start_refengine, wait_until
from tests.test_refengine import bit_exact

V = PRESETS["tiny"].vocab
KV_TOKENS = 512  # 32 blocks of 16: the prompt and a filler do not both fit
PAGE = 64
PROMPT_TOKENS = 4 * PAGE + 20  # 4 whole pages restorable, 20 tokens always computed
FILLER_TOKENS = KV_TOKENS - 8  # takes every block of the pool
MAX_TOKENS = 8
DRAIN_GAUGES = ("orbitkv_fabric_leases", "orbitkv_fabric_query_bytes", "orbitkv_transfer_inflight_ops",
                "orbitkv_transfer_inflight_copies", "orbitkv_tiers_ssd_inflight")
CONNECTOR_EXTRA = {"durability": "ssd", "timeout_s": 2, "load_deadline_ms": 10000, "save_deadline_ms": 10000}


def tokens(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(V) for _ in range(n)]


def recompute(prompts, max_tokens):
    """Outputs of a fresh engine without OrbitKV (same preset, seed, pool)."""
    with Engine(engine_config("tiny", kv_tokens=KV_TOKENS)) as e:
        return [e.generate([p], max_tokens)[0] for p in prompts]


def loaded(m):
    return m.get("orbitkv_fabric_loaded_tokens_total", 0.0)


def settled(peer, eng):
    """Engine holds no blocks for transfers and the peer's gauges are 0."""
    em, pm = eng.metrics(), peer.metrics()
    return em["orbitkv_refengine_requests_held"] == 0 and all(pm.get(g, 0) == 0 for g in DRAIN_GAUGES)


@pytest.fixture
def procs(tmpdir_short):
    peer = start_real_peer(tmpdir_short)
    eng = None
    try:
        eng = start_refengine(
            tmpdir_short, "engine", "--kv-tokens", str(KV_TOKENS), "--connector", "orbitkv",
            "--orbitkv-socket", peer.socket, "--connector-extra", json.dumps(CONNECTOR_EXTRA))
        yield peer, eng
    finally:
        if eng is not None:
            eng.stop()
        peer.stop()


@bit_exact
def test_prompt_restored_from_orbitkv_and_again_from_ssd_after_peer_restart(procs):
    peer, eng = procs
    prompt, filler1, filler2 = tokens(PROMPT_TOKENS, 1), tokens(FILLER_TOKENS, 2), tokens(FILLER_TOKENS, 3)
    want_prompt, want_f1, want_f2 = recompute([prompt, filler1, filler2], MAX_TOKENS)
    restored = PROMPT_TOKENS // PAGE * PAGE
    t = {}

    # 1. Cold: computed, saved to the peer (write-through to SSD).
    t0 = time.monotonic()
    first = eng.complete(prompt, MAX_TOKENS)
    t["cold_s"] = time.monotonic() - t0
    assert first["choices"][0]["token_ids"] == want_prompt
    assert first["usage"]["orbitkv_restored_tokens"] == 0
    assert eng.complete(filler1, MAX_TOKENS)["choices"][0]["token_ids"] == want_f1  # evicts the prompt locally
    wait_until(lambda: settled(peer, eng), 20, "saves done, gauges at 0")

    # 2. Warm: the prompt's 4 pages come back from the peer.
    m0 = peer.metrics()
    t0 = time.monotonic()
    warm = eng.complete(prompt, MAX_TOKENS)
    t["restored_s"] = time.monotonic() - t0
    m1 = peer.metrics()
    assert warm["choices"][0]["token_ids"] == want_prompt == first["choices"][0]["token_ids"]
    assert warm["usage"]["orbitkv_restored_tokens"] == restored
    assert warm["usage"]["orbitkv_prefix_cache_hit_tokens"] == 0
    assert loaded(m1) - loaded(m0) == restored
    wait_until(lambda: settled(peer, eng), 20, "gauges at 0 after the restore")

    # 3. The peer dies: a request is recomputed, promptly, and is still right.
    peer.stop()  # SIGKILL
    t0 = time.monotonic()
    down = eng.complete(filler2, MAX_TOKENS, timeout=30)  # also evicts the prompt locally
    t["peer_down_s"] = time.monotonic() - t0
    assert down["choices"][0]["token_ids"] == want_f2
    assert down["usage"]["orbitkv_restored_tokens"] == 0
    assert t["peer_down_s"] < 15

    # 4. The peer restarts on the same data dir: DRAM is gone, SSD pages are
    #    recovered; the engine's sessions reopen and the prompt is restored.
    peer.start()
    t0 = time.monotonic()
    # The keepalives (every ~3.3 s) find their sessions unknown and reopen
    # them; a call would too, but only once gRPC has reconnected (<= 1 s).
    wait_until(lambda: peer.metrics()["orbitkv_fabric_sessions"] == 2, 15, "engine sessions reopened")
    t["reopen_s"] = time.monotonic() - t0
    after = eng.complete(prompt, MAX_TOKENS)
    m2 = peer.metrics()
    assert after["choices"][0]["token_ids"] == want_prompt
    assert after["usage"]["orbitkv_restored_tokens"] == restored, eng.log_tail()
    assert after["usage"]["orbitkv_prefix_cache_hit_tokens"] == 0
    assert loaded(m2) == restored  # counters start at 0 in the new process
    assert "reopened as" in eng.log_tail(20000)
    wait_until(lambda: settled(peer, eng), 20, "gauges at 0 after the restart")
    assert peer.metrics()["orbitkv_fabric_sessions"] == 2  # scheduler + worker, not opened twice

    # 5. The engine exits cleanly: its pool file is gone, its sessions closed.
    shm = eng.shm_files()
    assert shm and eng.stop() == 0 and not any(os.path.exists(f) for f in shm)
    wait_until(lambda: peer.metrics()["orbitkv_fabric_sessions"] == 0, 10, "engine sessions closed")
    print(f"\nrestored {restored} tokens (x2); timings: " + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in t.items())
          + f"; peer after restart: {json.dumps({k: v for k, v in m2.items() if 'loaded_pages' in k or 'promoted' in k})}")


@bit_exact
def test_a_corrupted_restore_changes_the_output(tmpdir_short, monkeypatch):
    """The control for every "outputs match their reference" result: the peer's test-only
    hook (ORBITKV_TEST_CORRUPT_LOADS) flips one bit of a restored page past every checksum,
    and the engine's output then differs from a full recompute — so a wrong restore does not
    hide behind matching outputs."""
    monkeypatch.setenv("ORBITKV_TEST_CORRUPT_LOADS", "1")
    peer = start_real_peer(tmpdir_short)
    monkeypatch.delenv("ORBITKV_TEST_CORRUPT_LOADS")
    eng = None
    try:
        with open(os.path.join(tmpdir_short, "peer.log")) as f:
            assert "TEST HOOK" in f.read()
        eng = start_refengine(
            tmpdir_short, "engine", "--kv-tokens", str(KV_TOKENS), "--connector", "orbitkv",
            "--orbitkv-socket", peer.socket, "--connector-extra", json.dumps(CONNECTOR_EXTRA))
        prompt, filler = tokens(PROMPT_TOKENS, 1), tokens(FILLER_TOKENS, 2)
        want_prompt, want_f = recompute([prompt, filler], MAX_TOKENS)
        assert eng.complete(prompt, MAX_TOKENS)["choices"][0]["token_ids"] == want_prompt  # cold: nothing loaded
        assert eng.complete(filler, MAX_TOKENS)["choices"][0]["token_ids"] == want_f  # evicts the prompt locally
        wait_until(lambda: settled(peer, eng), 20, "saves done, gauges at 0")
        warm = eng.complete(prompt, MAX_TOKENS)
        assert warm["usage"]["orbitkv_restored_tokens"] == PROMPT_TOKENS // PAGE * PAGE
        assert warm["choices"][0]["token_ids"] != want_prompt, "a restore with a flipped bit gave the reference output"
    finally:
        if eng is not None:
            eng.stop()
        peer.stop()
