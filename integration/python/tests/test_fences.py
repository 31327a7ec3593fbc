"""orbitkv.vllm.fences: the scheduler half's record of blocks freed while
saves that read them are in flight (early_free), without vLLM."""

from __future__ import annotations

import types

from orbitkv.vllm.fences import SaveFences, handed_blocks
from orbitkv.vllm.metadata import LoadSpec, SavesDone


def test_a_released_requests_blocks_are_fenced_until_every_worker_reports():
    f = SaveFences(workers=2)
    f.saving("a", [1, 2, 3])
    f.saving("b", [3, 4])
    f.release("a")
    assert f.step([9]) == (["a"], [])  # released now; nothing of a's given out
    assert f.step([2, 9])[1] == ["a"] and f.flushes_total == 1
    assert f.reported({"a": 1}) == [] and f.step([1])[1] == ["a"]  # one worker of two: still fenced
    assert f.reported(SavesDone({"a": 1}).aggregate(SavesDone({"x": 1})).reports) == ["a"]
    assert f.fenced_blocks == 0 and f.step([1, 2, 3])[1] == []


def test_a_block_two_released_requests_read_names_both():
    f = SaveFences()
    for r, bs in (("a", [5, 6]), ("b", [6, 7])):
        f.saving(r, bs)
        f.release(r)
    assert f.step([6]) == (["a", "b"], ["a", "b"])
    assert f.reported({"b": 1}) == ["b"] and f.step([6, 7])[1] == ["a"]


def test_saves_that_ended_before_the_finish_or_a_preemption_fence_nothing():
    f = SaveFences()
    f.saving("a", [1])
    f.ended("a")  # a delayed free: the blocks were held until the saves ended
    f.saving("p", [2])
    f.preempted("p")  # the workers flush a preempted request's saves themselves
    f.release("a")
    f.release("p")
    assert f.fenced_blocks == 0 and f.step([1, 2])[1] == []
    assert f.reported({"nobody": 1}) == []  # a report of a request never released changes nothing


def test_the_blocks_a_step_hands_out():
    new = [types.SimpleNamespace(block_ids=([1, 2],)), types.SimpleNamespace(block_ids=[3])]
    cached = types.SimpleNamespace(new_block_ids=[([4],), None])
    so = types.SimpleNamespace(scheduled_new_reqs=new, scheduled_cached_reqs=cached)
    load = LoadSpec("r", 0, {0: [b"k"]}, [(5, 6)])
    assert handed_blocks(so, [load]) == {1, 2, 3, 4, 5, 6}
    older = types.SimpleNamespace(scheduled_new_reqs=[], scheduled_cached_reqs=[types.SimpleNamespace(new_block_ids=[7])])
    assert handed_blocks(older, []) == {7}


def test_a_new_requests_prefix_cache_hits_are_not_handed_out():
    """vLLM's own prefix-cache hits (num_computed_tokens, 16-token blocks)
    are read, not written: a fence on them needs no flush."""
    new = [types.SimpleNamespace(block_ids=([1, 2, 3, 4],), num_computed_tokens=32)]
    so = types.SimpleNamespace(scheduled_new_reqs=new, scheduled_cached_reqs=None)
    assert handed_blocks(so, [], block_size=16) == {3, 4}
    assert handed_blocks(so, []) == {1, 2, 3, 4}  # block size unknown: every block counts
