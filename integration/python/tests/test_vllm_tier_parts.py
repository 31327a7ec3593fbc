"""The tier's pure parts, without vLLM or a peer: the lookup verdict cache
(orbitkv.vllm_tier.verdicts), its page keys and layout (.pagekeys) and its
options (.config)."""

from __future__ import annotations

import random
import types

import pytest

from orbitkv import keys
from orbitkv.vllm_tier.config import TierConfig
from orbitkv.vllm_tier.pagekeys import BYTE_LAYOUT_PREFIX, RowFormat, page_key
from orbitkv.vllm_tier.verdicts import Verdicts

K1, K2, K3 = b"k1" * 9, b"k2" * 9, b"k3" * 9


# --- verdicts --------------------------------------------------------------------------


def test_first_ask_is_not_yet_and_one_probe_goes_out():
    v = Verdicts(refresh_s=0.5)
    assert v.lookup(K1, "a", 0.0) is None
    assert v.lookup(K1, "b", 0.0) is None  # a second request shares the probe
    batch = v.take_batch()
    assert [(p.key, p.req_id) for p in batch] == [(K1, "a")]
    assert v.take_batch() == [] and v.probing == 1
    v.resolve(K1, batch[0].generation, True, 0.1)
    assert v.lookup(K1, "a", 0.2) is True and v.probing == 0


def test_batch_keeps_the_order_asked():
    v = Verdicts(0.5)
    for k in (K3, K1, K2):
        v.lookup(k, "a", 0.0)
    assert [p.key for p in v.take_batch()] == [K3, K1, K2]


def test_stale_absent_is_reprobed_but_still_answered_absent():
    v = Verdicts(refresh_s=0.5)
    v.lookup(K1, "a", 0.0)
    (p,) = v.take_batch()
    v.resolve(K1, p.generation, False, 0.0)
    assert v.lookup(K1, "a", 0.4) is False and v.take_batch() == []  # fresh: trusted
    assert v.lookup(K1, "a", 0.6) is False  # stale: still absent, a new probe queued
    (p2,) = v.take_batch()
    assert p2.generation != p.generation
    v.resolve(K1, p2.generation, True, 0.7)
    assert v.lookup(K1, "a", 0.7) is True


def test_result_of_an_old_probe_is_dropped():
    v = Verdicts(0.5)
    v.lookup(K1, "a", 0.0)
    (old,) = v.take_batch()
    v.release("a")  # still in flight: kept
    v.resolve(K1, old.generation + 7, True, 0.1)  # not its probe
    assert v.probing == 1
    v.resolve(K1, old.generation, True, 0.1)  # its probe: nobody wants it, forgotten
    assert len(v) == 0


def test_failed_load_turns_a_hit_into_a_miss():
    v = Verdicts(0.5)
    v.lookup(K1, "a", 0.0)
    (p,) = v.take_batch()
    v.resolve(K1, p.generation, True, 0.0)
    v.mark_miss([K1, K2], 0.1)  # K2 unknown: ignored
    assert v.lookup(K1, "a", 0.2) is False


def test_release_forgets_keys_nobody_refers_to():
    v = Verdicts(0.5)
    v.lookup(K1, "a", 0.0)
    v.lookup(K1, "b", 0.0)
    (p,) = v.take_batch()
    v.resolve(K1, p.generation, True, 0.0)
    v.release("a")
    assert len(v) == 1
    v.release("b")
    assert len(v) == 0


def test_verdicts_against_a_naive_model():
    """Random asks, answers, releases and failed loads against a model that
    keeps, per key, the last answer and when it came: an answer given is
    always the model's, and a key is never probed twice at once."""
    rng = random.Random(7)
    v = Verdicts(refresh_s=1.0)
    truth: dict[bytes, tuple[bool, float]] = {}
    in_flight: dict[bytes, int] = {}
    ks = [bytes([i]) * 18 for i in range(6)]
    now = 0.0
    for _ in range(3000):
        now += rng.random() * 0.3
        op = rng.random()
        if op < 0.5:
            k, req = rng.choice(ks), rng.choice("abc")
            got = v.lookup(k, req, now)
            if k in truth:
                assert got is truth[k][0]
            else:
                assert got is None
        elif op < 0.7:
            for p in v.take_batch():
                assert p.key not in in_flight
                in_flight[p.key] = p.generation
        elif op < 0.85 and in_flight:
            k = rng.choice(sorted(in_flight))
            found = rng.random() < 0.5
            v.resolve(k, in_flight.pop(k), found, now)
            truth[k] = (found, now)
            if k not in v._by_key:  # nobody asked for it any more: forgotten
                truth.pop(k)
        elif op < 0.95:
            v.release(rng.choice("abc"))
            truth = {k: t for k, t in truth.items() if k in v._by_key}
        else:
            k = rng.choice(ks)
            v.mark_miss([k], now)
            if k in v._by_key:
                truth[k] = (False, now)
        assert v.probing == len(in_flight) + sum(1 for st in v._by_key.values() if st.queued)


# --- page keys and layout -------------------------------------------------------------


def _spec(model="m", dtype="bfloat16", world=1, agnostic=True, layers=("l0", "l1")):
    g = types.SimpleNamespace(tokens_per_block=16, layer_names=layers)
    p = types.SimpleNamespace(world_size=world, tp_size=world, pp_size=1, pcp_size=1, dcp_size=1,
                              is_parallelism_agnostic=agnostic)
    c = types.SimpleNamespace(model=types.SimpleNamespace(name=model, dtype=dtype), groups=(g,), parallel=p,
                              cache=types.SimpleNamespace(tokens_per_hash=16, blocks_per_chunk=4),
                              replicated_layout=False, canonical_layout=False, kv_cache_layout=None)
    return types.SimpleNamespace(config=c)


def test_layout_is_one_layer_of_two_half_rows_named_by_the_format():
    lay = RowFormat.from_spec(_spec(), 8192).layout()
    assert (lay.num_layers, lay.page_tokens, lay.dtype) == (1, 64, "u8")
    assert lay.byte_layout.startswith(BYTE_LAYOUT_PREFIX)
    with pytest.raises(ValueError):
        RowFormat.from_spec(_spec(), 8191).layout()


@pytest.mark.parametrize("other", [
    dict(model="other"), dict(dtype="float16"), dict(layers=("l0",)), dict(world=2, agnostic=False),
])
def test_another_format_has_another_fingerprint(other):
    base = RowFormat.from_spec(_spec(), 8192).layout().fingerprint()
    assert RowFormat.from_spec(_spec(**other), 8192).layout().fingerprint() != base


def test_page_keys_depend_on_fingerprint_hash_and_group_and_not_on_the_connector_chain():
    fp = RowFormat.from_spec(_spec(), 8192).layout().fingerprint()
    h = bytes(range(32))
    k0 = page_key(fp, h + (0).to_bytes(4, "big"))
    assert len(k0) == keys.KEY_SIZE
    assert k0 == page_key(fp, h + (0).to_bytes(4, "big"))
    assert k0 != page_key(fp, h + (1).to_bytes(4, "big"))
    assert k0 != page_key(bytes(16), h + (0).to_bytes(4, "big"))
    assert k0 != keys.next_key(fp, keys.ZERO_KEY, list(h))


# --- options ----------------------------------------------------------------------------


def test_options_are_checked(monkeypatch):
    monkeypatch.delenv("ORBITKV_SOCKET", raising=False)
    with pytest.raises(ValueError, match="socket"):
        TierConfig.from_options({})
    monkeypatch.setenv("ORBITKV_SOCKET", "/run/orbitkv/orbitkv.sock")
    assert TierConfig.from_options({}).socket == "/run/orbitkv/orbitkv.sock"
    assert TierConfig.from_options({"zero_copy": False}).zero_copy == "off"
    assert TierConfig.from_options({"staging_chunks": "8"}).staging_chunks == 8
    assert TierConfig.from_options({}).staging_chunks == 0  # sized by the tier (staging_slots)
    assert TierConfig.from_options({}).request_level is True
    assert TierConfig.from_options({"request_level": "false"}).request_level is False
    assert TierConfig.from_options({"request_level": False}).request_level is False
    for bad in ({"durability": "tape"}, {"zero_copy": "maybe"}, {"load_deadline_ms": 0}, {"nope": 1},
                {"staging_chunks": -1}, {"request_level": "maybe"}, {"request_level": 1}):
        with pytest.raises(ValueError):
            TierConfig.from_options(bad)


def test_staging_is_sized_by_bytes_unless_set():
    from orbitkv.vllm_tier.staging import staging_slots

    qwen3_8b_row = 2_359_296  # 16 tokens x 36 layers x 8 KV heads x 128 x 2 (K, V) x 2 bytes
    assert staging_slots(0, 3640, qwen3_8b_row) == (1 << 30) // qwen3_8b_row == 455  # an 8 GiB pool
    assert staging_slots(0, 64, 8192) == 64  # never more rows than the pool has
    assert staging_slots(0, 100_000, 64 << 20) == 64  # rows of 64 MiB: still 64
    assert staging_slots(0, 10, 64 << 20) == 10
    assert staging_slots(8, 3640, qwen3_8b_row) == 8  # set: as set


def test_staging_takes_runs_of_slots_and_copies_rows_exactly(tmp_path):
    """Slots come as one run when there is one (a copy is then one call over a
    view), else the first free ones; either way every row lands where it should."""
    import numpy as np

    from orbitkv.vllm_tier.staging import StagingRegion

    pool = np.random.default_rng(3).integers(0, 256, (32, 64), dtype=np.uint8)
    r = StagingRegion(pool, 8, str(tmp_path))
    try:
        a, b = r._take(3), r._take(2)
        assert (a, b, r.available()) == ([0, 1, 2], [3, 4], 3)
        r.free(a)
        assert r._take(4) == [0, 1, 2, 5]  # no run of 4: the first free
        assert r._take(3) is None and r.available() == 2
        r.free([0, 1, 2, 5])
        assert r._take(8) is None and r._take(6) == [0, 1, 2, 5, 6, 7]
        r.free([0, 1, 2, 5, 7])  # a run of 3 at 0, then two lone slots
        for ids, want in (([9, 4, 20], [0, 1, 2]), ([1, 30], [5, 7])):  # one call over a view, then scattered
            slots = r.for_store(ids)
            assert slots == want
            assert np.array_equal(r.rows[slots], pool[ids])
            r.rows[slots] = 255 - r.rows[slots]
            r.finish_load(slots, [i + 1 for i in ids])
            assert np.array_equal(pool[[i + 1 for i in ids]], 255 - pool[ids])
        assert r.available() == 0
    finally:
        r.close()


# --- the README's command line ---------------------------------------------------------------


def readme_tier_line() -> list[str]:
    """The README's `--kv-offloading-backend native` command, as argv."""
    import os
    import shlex

    readme = os.path.join(os.path.dirname(__file__), "..", "..", "..", "README.md")
    with open(readme) as f:
        lines = [l.strip() for l in f if l.strip().startswith("vllm serve ") and "orbitkv.vllm_tier" in l]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_readme_tier_line_configures_the_tier():
    import json
    import os

    argv = readme_tier_line()
    assert argv[argv.index("--kv-offloading-backend") + 1] == "native"
    assert float(argv[argv.index("--kv-offloading-size") + 1]) > 0
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    extra = kv["kv_connector_extra_config"]
    assert extra["spec_name"] == "TieringOffloadingSpec"
    (tier,) = extra["secondary_tiers"]
    assert (tier["type"], tier["module_path"]) == ("OrbitKVTier", "orbitkv.vllm_tier")
    options = {k: v for k, v in tier.items() if k not in ("type", "module_path")}
    assert os.path.isabs(TierConfig.from_options(options).socket)
