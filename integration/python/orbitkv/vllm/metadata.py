"""What the scheduler half tells the workers each step (picklable)."""

from __future__ import annotations

import dataclasses

from orbitkv.vllm._compat import KVConnectorMetadata, KVConnectorWorkerMetadata

SKIP_BLOCK = 0xFFFFFFFF  # orbitkv.client.SKIP_BLOCK (not imported: metadata stays light)


@dataclasses.dataclass
class PageSpan:
    """Pages of one request: keys per TP rank (each rank has its own layout
    fingerprint) and, per page, the engine block ids in sequence order."""

    req_id: str
    first_page: int
    keys: dict[int, list[bytes]]
    blocks: list[tuple[int, ...]]

    def __len__(self) -> int:
        return len(self.blocks)


@dataclasses.dataclass
class LoadSpec(PageSpan):
    leases: dict[int, str] = dataclasses.field(default_factory=dict)
    sync: bool = False  # True: finish inside this step (load_async was False)
    # Leading blocks of the first page the engine computed itself (a prefix
    # cache hit that ends inside the page): loaded as skips, never written.
    skip_blocks: int = 0

    def loaded_blocks(self, page: int) -> tuple[int, ...]:
        """Block ids page ``page`` of the span actually writes."""
        b = self.blocks[page]
        b = b[self.skip_blocks:] if page == 0 else b
        return tuple(x for x in b if x != SKIP_BLOCK)  # a tail page's blocks past the prompt


@dataclasses.dataclass
class SaveSpec(PageSpan):
    pass


@dataclasses.dataclass
class OrbitKVMetadata(KVConnectorMetadata):
    loads: list[LoadSpec] = dataclasses.field(default_factory=list)
    saves: list[SaveSpec] = dataclasses.field(default_factory=list)
    preempted: list[str] = dataclasses.field(default_factory=list)
    # early_free (orbitkv.vllm.fences): requests freed at finish with saves in
    # flight (their end is reported in SavesDone, never as finished_sending), and
    # requests whose saves must end before this step writes the blocks it reuses
    released: list[str] = dataclasses.field(default_factory=list)
    flush: list[str] = dataclasses.field(default_factory=list)

    @property
    def has_sync_loads(self) -> bool:
        return any(l.sync for l in self.loads)


@dataclasses.dataclass
class SavesDone(KVConnectorWorkerMetadata):
    """Worker -> scheduler: released requests whose saves all ended, with the
    number of workers that say so (vLLM sums the workers' reports: aggregate)."""

    reports: dict[str, int] = dataclasses.field(default_factory=dict)

    def aggregate(self, other: "SavesDone") -> "SavesDone":
        out = dict(self.reports)
        for r, n in getattr(other, "reports", {}).items():
            out[r] = out.get(r, 0) + n
        return SavesDone(out)
