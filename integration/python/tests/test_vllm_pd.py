"""P/D roles under vLLM's own Scheduler (installed vLLM, CPU): vLLM's
kv_role reaches the connector, a kv_producer's handoff params come back
through vLLM's outputs, and a kv_consumer given them waits (vLLM keeps the
request waiting while get_num_new_matched_tokens answers None), restores the
prompt byte-exact and saves nothing; promised pages that never come cost
the wait, then recompute. Skips without vLLM, as test_vllm_real_scheduler."""

from __future__ import annotations

import os
import random
import time

import pytest

if os.environ.get("ORBITKV_REQUIRE") != "vllm":
    pytest.importorskip("vllm", reason="vLLM is not installed here (make test runs this in its vLLM environment)")

import torch  # noqa: E402

from orbitkv.vllm import pd  # noqa: E402
from tests.vllm_harness import Harness  # noqa: E402


def _prompt(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 1000) for _ in range(n)]


def _by_source_supported() -> bool:
    try:
        import vllm.v1.metrics.cache_hit_source  # noqa: F401
    except ImportError:
        return False
    return True


def _saved(peer) -> float:
    return peer.metrics().get("orbitkv_fabric_saved_pages_total", 0)


def test_producer_hands_a_prompt_to_a_consumer_through_vllm(real_peer):
    prompt = _prompt(40, 300)  # 4 pages of 64 tokens saved, 4 loaded ((300 - 1) // 64)
    ref = Harness(real_peer.socket, num_blocks=64, connector=False)
    ref.add("r", prompt, max_tokens=3)
    ref.run()
    ref.close()

    prod = Harness(real_peer.socket, num_blocks=64, extra={"kv_role": "kv_producer", "engine_id": "prefill"})
    assert prod.connector.cfg.kv_role == "kv_producer"
    prod.add("p", prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
    prod.run()
    prod.close()  # joins the saves
    params = prod.finished["p"].kv_transfer_params
    assert params and params["do_remote_prefill"] and params[pd.PAGES] == 300 // 64 + 1, params  # and the tail
    assert prod.finished["p"].tokens == ref.finished["r"].tokens[:1]
    saved = _saved(real_peer)
    assert saved == 5  # 4 pages and the 44-token tail

    cons = Harness(real_peer.socket, num_blocks=64, extra={"kv_role": "kv_consumer", "pd_wait_ms": 5000})
    try:
        cons.add("d", prompt, max_tokens=3, kv_transfer_params=params)
        cons.run()
        assert cons.finished["d"].tokens == ref.finished["r"].tokens
        assert cons.loaded_pages == 5 and cons.checked_tokens >= 299
        assert (cons.connector.handoffs.completed, cons.connector.handoffs.timed_out) == (1, 0)
    finally:
        cons.close()
    assert _saved(real_peer) == saved  # the consumer saved nothing


def test_consumer_waits_then_recomputes_pages_that_never_come(real_peer):
    prompt = _prompt(41, 300)
    cons = Harness(real_peer.socket, num_blocks=64, extra={"kv_role": "kv_consumer", "pd_wait_ms": 300})
    try:
        cons.add("d", prompt, max_tokens=2, kv_transfer_params=pd.handoff_params("gone", 4, 64, None))
        t0 = time.monotonic()
        cons.run()
        took = time.monotonic() - t0
        assert set(cons.finished) == {"d"} and cons.loaded_pages == 0
        assert took >= 0.3 and cons.connector.handoffs.timed_out == 1
    finally:
        cons.close()
    assert _saved(real_peer) == 0


@pytest.mark.parametrize("loads", [True, None], ids=["async", "default"])
@pytest.mark.parametrize("n", [8, 40, 64, 128, 130])
def test_handoff_covers_the_whole_prompt_tail_included(real_peer, n, loads):
    """The producer hands over the whole prompt: its whole pages and its
    partial last page (the tail, saved under its tail key), a page-aligned
    prompt's last page too. The consumer's hit covers the whole prompt (vLLM
    computes only the last token again after the async load), and every block
    of the prompt, the tail's last partial block included, holds the
    producer's bytes. With async_load unset too: a handoff loads async even
    where other hits load inside the step (vLLM >= 0.29)."""
    prompt = _prompt(1000 + n, n)
    prod = Harness(real_peer.socket, num_blocks=64, extra={"kv_role": "kv_producer", "engine_id": "prefill"})
    try:
        prod.add("p", prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
        prod.run()
        params = prod.finished["p"].kv_transfer_params
        blocks = -(-n // prod.block_size)
        pblocks = params["remote_block_ids"][:blocks]
        assert len(pblocks) == blocks, params
        want = prod.phys[:, pblocks].clone()
    finally:
        prod.close()
    assert params[pd.PAGES] == -(-n // 64) and params[pd.TAIL_TOKENS] == n % 64, params

    cons = Harness(real_peer.socket, num_blocks=64, extra={"kv_role": "kv_consumer", "pd_wait_ms": 5000, "async_load": loads})
    seen: dict[str, list[int]] = {}
    track = cons._track_blocks

    def _track(so):
        track(so)
        if "d" in cons._blocks:
            seen["d"] = list(cons._blocks["d"])

    cons._track_blocks = _track
    by_source = _by_source_supported()
    hits = cons.record_hits_by_source() if by_source else None
    try:
        cons.add("d", prompt, max_tokens=1, kv_transfer_params=params)
        cons.run()
        if by_source:  # vLLM 0.33: the whole prompt counted as from the host (the peer's DRAM)
            assert hits == [(n, {"host": n})], hits
        assert "d" in cons.finished
        # vLLM computed the last prompt token only: the rest was the external hit.
        assert cons.scheduled_tokens == 1, cons.scheduled_tokens
        assert cons.loaded_pages == -(-n // 64) and cons.checked_tokens >= n - 1
        got = cons.phys[:, seen["d"][:blocks]]
        # byte-exact (NaN past the prompt in both: bit patterns, not values)
        assert torch.equal(got.contiguous().view(torch.int32), want.contiguous().view(torch.int32))
        assert cons.finished["d"].tokens == prod.finished["p"].tokens
    finally:
        cons.close()


def test_a_sync_consumer_leaves_the_tail_to_compute(real_peer):
    """With async_load false vLLM must compute at least the last token itself
    after a sync hit: the hit ends on the last page boundary before it, as
    before the tail, and the tail's tokens are computed."""
    n = 130
    prompt = _prompt(2000, n)
    prod = Harness(real_peer.socket, num_blocks=64, extra={"kv_role": "kv_producer", "engine_id": "prefill"})
    try:
        prod.add("p", prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
        prod.run()
    finally:
        prod.close()
    params = prod.finished["p"].kv_transfer_params
    assert params[pd.PAGES] == 3 and params[pd.TAIL_TOKENS] == 2, params
    cons = Harness(real_peer.socket, num_blocks=64,
                   extra={"kv_role": "kv_consumer", "pd_wait_ms": 5000, "async_load": False})
    try:
        cons.add("d", prompt, max_tokens=2, kv_transfer_params=params)
        cons.run()
        assert cons.loaded_pages == 2 and cons.scheduled_tokens == n - 128 + 1
        assert cons.finished["d"].tokens[:1] == prod.finished["p"].tokens
        assert (cons.connector.handoffs.completed, cons.connector.handoffs.timed_out) == (1, 0)
    finally:
        cons.close()


@pytest.mark.parametrize("n", [40, 130])
def test_a_local_prefix_hit_inside_the_tail_page_loads_the_rest_of_it(real_peer, n):
    """The consumer's own prefix cache holds the prompt's leading blocks up to
    inside the tail page (vLLM keeps at most n - 1 tokens): the tail is loaded
    with those blocks skipped, and vLLM computes only the last token."""
    prompt = _prompt(3000 + n, n)
    prod = Harness(real_peer.socket, num_blocks=64, extra={"kv_role": "kv_producer", "engine_id": "prefill"})
    try:
        prod.add("p", prompt, max_tokens=1, kv_transfer_params={"do_remote_decode": True, "do_remote_prefill": False})
        prod.run()
    finally:
        prod.close()
    params = prod.finished["p"].kv_transfer_params
    cons = Harness(real_peer.socket, num_blocks=64, extra={"kv_role": "kv_consumer", "pd_wait_ms": 5000})
    try:
        cons.add("local", prompt, max_tokens=1)  # no handoff: its blocks stay in vLLM's prefix cache
        cons.run()
        loaded, scheduled = cons.loaded_pages, cons.scheduled_tokens
        cons.add("d", prompt, max_tokens=1, kv_transfer_params=params)
        cons.run()
        assert cons.loaded_pages - loaded == 1  # the tail page only, its locally held blocks skipped
        assert cons.scheduled_tokens - scheduled == 1
        assert cons.finished["d"].tokens == prod.finished["p"].tokens
    finally:
        cons.close()
