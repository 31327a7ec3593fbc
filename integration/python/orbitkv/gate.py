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


@dataclasses.dataclass
class RestoreGate:
    """Admission holds of restoring requests and save holds of every request."""

    enabled: bool = True
    _holds: dict[str, _Hold] = dataclasses.field(default_factory=dict)
    _saves: dict[str, int] = dataclasses.field(default_factory=dict)

    # --- admission ---------------------------------------------------------

    def query(self, req_id: str) -> Admission:
        """Decides a lookup of ``req_id`` (one call per scheduler visit)."""
        if not self.enabled:
            return Admission.PROCEED
        if any(r != req_id for r in self._holds):
            return Admission.DEFER
        return Admission.PROCEED

    def allocated(self, req_id: str, external_tokens: int, now: float) -> None:
        """The request got its blocks; with external tokens it takes the gate.
        A second allocation call with zero external tokens (vLLM calls it
        again after an async load) leaves an existing hold alone."""
        if external_tokens > 0 and req_id not in self._holds:
            self._holds[req_id] = _Hold(HoldState.LOADING, now)

    def load_finished(self, req_id: str) -> None:
        """The copy into the request's blocks ended. The hold stays."""
        h = self._holds.get(req_id)
        if h is not None:
            h.state = HoldState.LOADED

    def computed(self, req_id: str) -> None:
        """The request's first compute step was scheduled: release admission."""
        self._holds.pop(req_id, None)

    def finished(self, req_id: str) -> bool:
        """The request finished or was cancelled. Releases admission; returns
        True when save holds remain (the caller delays freeing its blocks)."""
        self._holds.pop(req_id, None)
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
