"""orbitkv.vllm.failed_pages: which pages of a hit may be offered after loads failed
(issue 33), as a pure state machine: the clock is an input."""

from orbitkv.vllm.failed_pages import FailedPages

K = [bytes([i]) * 16 for i in range(6)]


def test_a_request_is_never_offered_its_own_failed_page_again():
    f = FailedPages(hold_s=10)
    assert f.offer(K, 5, now=0.0) == 5
    assert f.offer(K, 5, now=0.0, failed_at=0) == 0
    assert f.offer(K, 5, now=1e9, failed_at=2) == 2  # whatever the time
    assert f.offer(K, 1, now=0.0, failed_at=2) == 1


def test_a_failed_key_is_held_back_from_every_request_for_the_hold_time():
    f = FailedPages(hold_s=10)
    f.failed(K[3], now=100.0)
    assert f.offer(K, 5, now=100.0) == 3 and f.offer(K, 2, now=105.0) == 2
    assert f.offer(K, 5, now=109.9) == 3
    assert f.offer(K, 5, now=110.0) == 5 and len(f) == 0  # once more, after the hold
    assert f.failures == 1


def test_a_held_key_the_peer_stopped_listing_is_a_new_copy_when_listed_again():
    f = FailedPages(hold_s=10)
    f.failed(K[2], now=0.0)
    f.listed(K, 5)  # still listed: still held
    assert f.offer(K, 5, now=1.0) == 2
    f.listed(K, 1)  # page 1 missing: says nothing about page 2
    assert f.offer(K, 5, now=1.0) == 2
    f.listed(K, 2)  # page 2 is the first the peer does not hold: dropped
    assert f.offer(K, 5, now=1.0) == 5 and len(f) == 0


def test_at_most_max_keys_are_held_oldest_first_out():
    f = FailedPages(hold_s=10, max_keys=2)
    for i in (1, 2, 3):
        f.failed(K[i], now=0.0)
    assert len(f) == 2
    assert f.offer(K, 5, now=0.0) == 2  # K[1] went first; K[2] is held
