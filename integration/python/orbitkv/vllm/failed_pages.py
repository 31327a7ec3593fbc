"""Bounded retries of external hits whose load failed (issue 33).

A page the peer keeps listing may keep failing to load (a remote fetch that
times out, a member's error). vLLM recomputes from the first failed block,
but a request whose first page failed asks the connector again from token 0:
offered the same hit, it reloaded forever. The decision here is a pure state
machine with explicit inputs (the scheduler half feeds it; no clock, no
calls of its own):

- ``failed(key, now)``: a load of the page ``key`` failed.
- ``listed(keys, hit_pages)``: a lookup's answer for the chain ``keys``: a
  held key at ``hit_pages`` (the first page the peer no longer holds) is
  gone from the peer, so when it is listed again it is a new copy, no
  longer held back.
- ``offer(keys, hit_pages, now, failed_at)``: how many leading pages of a
  hit may be offered: none from the request's own failed page on
  (``failed_at``: a request never retries a page that failed for it), and
  none from a key held back for another request's failure, for HOLD_S after
  it failed. At most MAX_KEYS keys are held (the oldest go first).

So each page is loaded at most once per request, and at most once per
HOLD_S across requests unless the peer dropped it and listed it again.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Optional, Sequence

HOLD_S = 30.0
MAX_KEYS = 4096


class FailedPages:
    def __init__(self, hold_s: float = HOLD_S, max_keys: int = MAX_KEYS) -> None:
        self.hold_s = hold_s
        self.max_keys = max_keys
        self._held: OrderedDict[bytes, float] = OrderedDict()  # key -> held until (the clock's seconds)
        self.failures = 0  # pages reported failed so far

    def __len__(self) -> int:
        return len(self._held)

    def failed(self, key: bytes, now: float) -> None:
        self.failures += 1
        self._held[key] = now + self.hold_s
        self._held.move_to_end(key)
        while len(self._held) > self.max_keys:
            self._held.popitem(last=False)

    def listed(self, keys: Sequence[bytes], hit_pages: int) -> None:
        if 0 <= hit_pages < len(keys):
            self._held.pop(keys[hit_pages], None)

    def offer(self, keys: Sequence[bytes], hit_pages: int, now: float, failed_at: Optional[int] = None) -> int:
        n = hit_pages if failed_at is None else min(hit_pages, failed_at)
        for i, k in enumerate(keys[:n]):
            until = self._held.get(k)
            if until is None:
                continue
            if now >= until:
                del self._held[k]
                continue
            return i
        return max(0, n)
