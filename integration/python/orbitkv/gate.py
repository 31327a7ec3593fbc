"""The restore admission gate (seeds: "Restore-admission stall").

vLLM's waiting-queue pass stops at the first request whose block allocation
fails. A cold request at the head that needs one block more than is free
would then hide, forever, a restored request behind it that already holds
its blocks: neither makes progress. The gate prevents that state:

* A request that is allocated with external (restored) tokens takes the gate
  and holds it from that allocation through its first scheduled compute step.
  Copy completion alone does not release it.
* While any other request holds the gate, lookups of new requests defer
  admission (vLLM: ``get_num_new_matched_tokens`` returns ``None``, which
  skips the request without stopping the queue pass), so the pass reaches
  the restored request, which is then scheduled and eventually frees blocks.
* Cancellation (the request finishes before computing) releases admission;
  save holds are separate and keep their own lifetime: the request's blocks
  stay allocated (delayed free) until its saves are reported done.

Two modes. *Strict* (the default, and the only one for schedulers whose
waiting order is not known): any hold defers every other lookup, so one
request at a time restores and nothing is admitted beside it.

*Queue-aware* (``skipped_first=True`` with ``capacity_blocks``): for a
scheduler that visits the requests it skipped (restores in flight, deferred
requests) before any new one — vLLM ≥ 0.26 under FCFS (``Scheduler.
_select_waiting_queue_for_scheduling``) — a request that restores nothing
can never stand in front of a holder, so it proceeds; and several restores
may hold admission at once as long as their prompts' blocks fit the cache
together, so that with nothing else running every holder can still complete.
Only a restore that would overfill that sum is deferred. The strict mode cost
the seeds' workload on the H200 most of its restores' gain: each restore
held off every arrival for its load plus one engine step
(docs/journal/2026-12-01-vllm-h200.md, "Real vLLM on the H200").

A pure state machine: inputs are explicit (request ids, token counts, the
time), no I/O and no threads; the connector's scheduler half drives it.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional


class Admission(enum.Enum):
    PROCEED = "proceed"
    DEFER = "defer"  # ask again next step (vLLM: return None)


class HoldState(enum.Enum):
    LOADING = "loading"  # allocated with external tokens, copy in flight
    LOADED = "loaded"  # copy finished (ok or not), not yet computed


@dataclasses.dataclass
class _Hold:
    state: HoldState
    since: float
    blocks: int = 0  # the holder's prompt blocks (queue-aware mode)


@dataclasses.dataclass
class GateStats:
    """Counters since the last ``take_stats``: what the gate cost."""

    restores: int = 0  # holds taken
    hold_s: float = 0.0  # seconds held, summed over released holds
    deferred_restores: int = 0  # lookups of restores deferred
    deferred_misses: int = 0  # lookups of requests restoring nothing, deferred
    deferred_budget: int = 0  # restores deferred because the query budget cut their hit
    max_holders: int = 0  # most holds at once


@dataclasses.dataclass
class RestoreGate:
    """Admission holds of restoring requests and save holds of every request."""

    enabled: bool = True
    skipped_first: bool = False  # the scheduler visits skipped requests before new ones
    capacity_blocks: int = 0  # blocks of the engine's cache (0: unknown: strict)
    _holds: dict[str, _Hold] = dataclasses.field(default_factory=dict)
    _saves: dict[str, int] = dataclasses.field(default_factory=dict)
    stats: GateStats = dataclasses.field(default_factory=GateStats)  # since the last take_stats
    totals: GateStats = dataclasses.field(default_factory=GateStats)  # since the start
    epoch: int = 0  # holds released so far: a deferral stands while it has not moved

    # --- admission ---------------------------------------------------------

    @property
    def queue_aware(self) -> bool:
        return self.skipped_first and self.capacity_blocks > 0

    def query(self, req_id: str, restore_blocks: int = -1) -> Admission:
        """Decides a lookup of ``req_id`` (one call per scheduler visit).
        ``restore_blocks``: the request's prompt blocks if it would restore,
        0 if it would not, -1 if not known (treated as a restore)."""
        if not self.enabled:
            return Admission.PROCEED
        others = [h for r, h in self._holds.items() if r != req_id]
        if not others:
            return Admission.PROCEED
        if self.queue_aware:
            if restore_blocks == 0:
                return Admission.PROCEED
            if restore_blocks > 0 and sum(h.blocks for h in others) + restore_blocks <= self.capacity_blocks:
                return Admission.PROCEED
        self._count("deferred_misses" if restore_blocks == 0 else "deferred_restores", 1)
        return Admission.DEFER

    def defer_for_budget(self) -> Admission:
        """A restore the query budget cut short while others hold admission or
        live leases: deferred (the budget frees as their loads end), and counted."""
        self._count("deferred_budget", 1)
        return Admission.DEFER

    def _count(self, name: str, n: float) -> None:
        for st in (self.stats, self.totals):
            setattr(st, name, getattr(st, name) + n)
            st.max_holders = max(st.max_holders, len(self._holds))

    def allocated(self, req_id: str, external_tokens: int, now: float, blocks: int = 0) -> None:
        """The request got its blocks; with external tokens it takes the gate.
        ``blocks``: its prompt's blocks (what it needs to complete).
        A second allocation call with zero external tokens (vLLM calls it
        again after an async load) leaves an existing hold alone."""
        if external_tokens > 0 and req_id not in self._holds:
            self._holds[req_id] = _Hold(HoldState.LOADING, now, blocks)
            self._count("restores", 1)

    def others_hold(self, req_id: str) -> bool:
        """Whether a request other than ``req_id`` holds admission."""
        return any(r != req_id for r in self._holds)

    def _release(self, req_id: str, now: Optional[float]) -> None:
        h = self._holds.pop(req_id, None)
        if h is not None:
            self.epoch += 1
            if now is not None:
                self._count("hold_s", max(0.0, now - h.since))

    def take_stats(self) -> GateStats:
        """Returns the counters and starts new ones."""
        st, self.stats = self.stats, GateStats(max_holders=len(self._holds))
        return st

    def load_finished(self, req_id: str) -> None:
        """The copy into the request's blocks ended. The hold stays."""
        h = self._holds.get(req_id)
        if h is not None:
            h.state = HoldState.LOADED

    def computed(self, req_id: str, now: Optional[float] = None) -> None:
        """The request's first compute step was scheduled: release admission."""
        self._release(req_id, now)

    def finished(self, req_id: str, now: Optional[float] = None) -> bool:
        """The request finished or was cancelled. Releases admission; returns
        True when save holds remain (the caller delays freeing its blocks)."""
        self._release(req_id, now)
        return self._saves.get(req_id, 0) > 0

    # --- save holds ----------------------------------------------------------

    def save_started(self, req_id: str, ops: int = 1) -> None:
        self._saves[req_id] = self._saves.get(req_id, 0) + ops

    def saves_done(self, req_id: str) -> None:
        """All of the request's saves were reported done."""
        self._saves.pop(req_id, None)

    def reset_saves(self, req_id: str) -> None:
        """Forget save holds (after a preemption flushed them)."""
        self._saves.pop(req_id, None)

    # --- inspection ------------------------------------------------------------

    def holder(self) -> Optional[str]:
        return next(iter(self._holds), None)

    def hold_state(self, req_id: str) -> Optional[HoldState]:
        h = self._holds.get(req_id)
        return h.state if h else None

    def held_for(self, now: float) -> float:
        """Seconds the oldest hold has been held (0 when free)."""
        return max((now - h.since for h in self._holds.values()), default=0.0)

    def has_save_holds(self, req_id: str) -> bool:
        return self._saves.get(req_id, 0) > 0
