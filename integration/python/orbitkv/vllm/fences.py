"""Flush on reuse: the scheduler half's record of blocks freed while saves
that read them are in flight (the connector's ``early_free``).

By default a finished request with saves in flight keeps its blocks until
the workers report the saves ended (``request_finished`` returns True: vLLM's
delayed free), at least one step after it finished. With ``early_free`` it
returns False: vLLM frees the blocks at once, and this record fences them.
When vLLM hands a fenced block out again — to a request it schedules or to
a load the connector plans — the step's metadata names the released
requests whose saves read it (``flush``), and each worker waits for those
saves before anything in the step writes a block (``WorkerHalf.begin_step``,
from ``handle_preemptions``, which vLLM calls before it zeroes or copies a
new block, and again at bind; bounded by the save deadline, as a delayed free
is). A freed block goes to
the back of vLLM's free queue, so a fence is rarely met: the saves have
mostly ended before their blocks come round again.

The workers report a released request's saves ended in the step's worker
metadata (``SavesDone``), never as ``finished_sending``: vLLM asserts a
request it hears of there still exists. A fence drops once every worker
has reported.

A pure record: no I/O, no threads; the scheduler half drives it.
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping

from orbitkv.vllm._compat import block_ids_of


class SaveFences:
    def __init__(self, workers: int = 1) -> None:
        self.workers = max(1, workers)
        self._blocks: dict[str, set[int]] = {}  # request -> blocks its planned saves read
        self._fence: dict[int, set[str]] = {}  # freed block -> released requests whose saves read it
        self._released: list[str] = []  # released since the last step's metadata
        self._reports: dict[str, int] = {}  # released request -> workers that reported its saves ended
        self.released_total = 0  # requests freed at finish with saves in flight
        self.flushes_total = 0  # (step, request) flushes planned: a fenced block handed out again

    def saving(self, req_id: str, blocks: Iterable[int]) -> None:
        """A save of ``blocks`` was planned for the request."""
        self._blocks.setdefault(req_id, set()).update(blocks)

    def release(self, req_id: str) -> None:
        """The request finished with saves in flight; vLLM frees its blocks now."""
        for b in self._blocks.get(req_id, ()):
            self._fence.setdefault(b, set()).add(req_id)
        self._released.append(req_id)
        self.released_total += 1

    def preempted(self, req_id: str) -> None:
        """The workers wait for a preempted request's saves before the step
        (handle_preemptions): the blocks it held are not fenced."""
        if req_id not in self._reports and req_id not in self._released:
            self._blocks.pop(req_id, None)

    def step(self, handed: Iterable[int]) -> tuple[list[str], list[str]]:
        """(released, flush) for the step's metadata: the requests released
        since the last step, and those whose saves read a block in ``handed``
        (the blocks the step gives out)."""
        flush = sorted({r for b in handed for r in self._fence.get(b, ())})
        self.flushes_total += len(flush)
        released, self._released = self._released, []
        for r in released:
            self._reports.setdefault(r, 0)
        return released, flush

    def reported(self, reports: Mapping[str, int]) -> list[str]:
        """Workers' SavesDone reports; returns the requests all workers have
        now reported (their fences are gone)."""
        done = []
        for r, n in reports.items():
            if r not in self._reports:
                continue
            self._reports[r] += int(n)
            if self._reports[r] >= self.workers:
                done.append(r)
                self._end(r)
        return done

    def ended(self, req_id: str) -> None:
        """The request's saves ended and its blocks were held for them (a
        delayed free): nothing is fenced."""
        if req_id not in self._reports:
            self._blocks.pop(req_id, None)

    def _end(self, req_id: str) -> None:
        self._reports.pop(req_id, None)
        for b in self._blocks.pop(req_id, ()):
            rs = self._fence.get(b)
            if rs is not None:
                rs.discard(req_id)
                if not rs:
                    del self._fence[b]

    @property
    def fenced_blocks(self) -> int:
        return len(self._fence)


def handed_blocks(scheduler_output: Any, loads: Iterable[Any], block_size: int = 0) -> set[int]:
    """Blocks a step may write: the new blocks of the requests it schedules
    and those its planned loads write. A new request's leading blocks that
    vLLM's own prefix cache already holds (``num_computed_tokens`` of them,
    ``block_size`` tokens a block) are read, never written: not counted."""
    out: set[int] = set()
    for nr in getattr(scheduler_output, "scheduled_new_reqs", None) or ():
        ids = block_ids_of(nr.block_ids)
        hit = int(getattr(nr, "num_computed_tokens", 0) or 0) // block_size if block_size > 0 else 0
        out.update(ids[hit:])
    cr = getattr(scheduler_output, "scheduled_cached_reqs", None)
    if isinstance(cr, list):  # older vLLM: one object per request
        for c in cr:
            out.update(block_ids_of(getattr(c, "new_block_ids", None)))
    elif cr is not None:
        for new in getattr(cr, "new_block_ids", None) or ():
            out.update(block_ids_of(new))
    for spec in loads:
        for page in spec.blocks:
            out.update(page)
    return out
