"""What the peer answered about each key, as the scheduler thread sees it.

vLLM asks a secondary tier about one key at a time, under its manager lock,
and the tier must answer at once: HIT, MISS or RETRY ("not yet"). The peer
answers over a socket. So a key asked about for the first time is queued
(RETRY) and sent to the peer in one batch per engine step; its answer, when
the worker has it, is cached for the requests that asked.

Invariants:
 1. A key has at most one probe in flight; a result carries the generation
    of the probe it answers, and a result for any other generation (a key
    released and asked about again meanwhile) is dropped.
 2. A cached "present" stays until a load of the key fails (``mark_miss``)
    or no request refers to it; a cached "absent" is trusted for
    ``refresh_s``, after which the next ask starts a new probe but keeps
    answering "absent" until that probe lands (never RETRY twice for a key:
    a request waiting on a slow peer is not held a second time).
 3. ``release(req)`` drops the request's references; a key nobody refers to
    is forgotten once no probe is in flight for it.

A pure state machine: time is an argument, no threads, no I/O. The tier
calls it under vLLM's manager lock.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass
class _State:
    result: Optional[bool] = None  # None: never answered
    at: float = 0.0  # when result was set
    probe: int = -1  # generation of the probe in flight, -1 none
    queued: bool = False  # the probe waits in the batch, not sent yet
    reqs: set = dataclasses.field(default_factory=set)


@dataclasses.dataclass(frozen=True)
class Probe:
    key: bytes
    req_id: str
    generation: int


class Verdicts:
    def __init__(self, refresh_s: float) -> None:
        self.refresh_s = refresh_s
        self._by_key: dict[bytes, _State] = {}
        self._req_keys: dict[str, set] = {}
        self._batch: list[Probe] = []
        self._next_gen = 0

    def __len__(self) -> int:
        return len(self._by_key)

    def lookup(self, key: bytes, req_id: str, now: float) -> Optional[bool]:
        """True/False: the peer's (cached) answer; None: ask again later."""
        st = self._by_key.get(key)
        if st is None:
            st = self._by_key[key] = _State()
        stale = st.result is False and now - st.at > self.refresh_s
        if st.probe < 0 and (st.result is None or stale):
            st.probe, st.queued = self._next_gen, True
            self._next_gen += 1
            self._batch.append(Probe(key, req_id, st.probe))
        st.reqs.add(req_id)
        self._req_keys.setdefault(req_id, set()).add(key)
        return st.result

    def take_batch(self) -> list[Probe]:
        """The probes queued since the last call, in the order asked."""
        out = [p for p in self._batch if self._queued(p)]
        for p in out:
            self._by_key[p.key].queued = False
        self._batch = []
        return out

    def _queued(self, p: Probe) -> bool:
        st = self._by_key.get(p.key)
        return st is not None and st.queued and st.probe == p.generation

    def resolve(self, key: bytes, generation: int, found: bool, now: float) -> None:
        st = self._by_key.get(key)
        if st is None or st.probe != generation:
            return
        st.result, st.at, st.probe = found, now, -1
        if not st.reqs:
            del self._by_key[key]

    def mark_miss(self, keys, now: float) -> None:
        """A load of these keys failed: answer "absent" (until refresh)."""
        for key in keys:
            st = self._by_key.get(key)
            if st is not None:
                st.result, st.at = False, now

    def release(self, req_id: str) -> None:
        for key in self._req_keys.pop(req_id, ()):
            st = self._by_key.get(key)
            if st is None:
                continue
            st.reqs.discard(req_id)
            if not st.reqs and st.probe < 0:
                del self._by_key[key]

    @property
    def probing(self) -> int:
        """Probes queued or in flight."""
        return sum(1 for st in self._by_key.values() if st.probe >= 0)
