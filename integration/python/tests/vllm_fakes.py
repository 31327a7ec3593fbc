"""Minimal stand-ins for the vLLM objects the connector reads."""

from __future__ import annotations

import dataclasses
from typing import Optional

from orbitkv import keys
from orbitkv.client import LookupResult


@dataclasses.dataclass
class Request:
    request_id: str
    prompt_token_ids: list[int]


@dataclasses.dataclass
class NewRequestData:
    req_id: str
    prompt_token_ids: list[int]
    block_ids: tuple[list[int], ...]
    num_computed_tokens: int


@dataclasses.dataclass
class CachedRequestData:
    req_ids: list[str] = dataclasses.field(default_factory=list)
    new_block_ids: list[Optional[tuple[list[int], ...]]] = dataclasses.field(default_factory=list)
    num_computed_tokens: list[int] = dataclasses.field(default_factory=list)
    resumed_req_ids: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class SchedulerOutput:
    scheduled_new_reqs: list[NewRequestData] = dataclasses.field(default_factory=list)
    scheduled_cached_reqs: CachedRequestData = dataclasses.field(default_factory=CachedRequestData)
    num_scheduled_tokens: dict[str, int] = dataclasses.field(default_factory=dict)
    preempted_req_ids: set[str] = dataclasses.field(default_factory=set)


@dataclasses.dataclass
class KVConnectorOutput:
    finished_sending: Optional[set[str]] = None
    finished_recving: Optional[set[str]] = None
    invalid_block_ids: set[int] = dataclasses.field(default_factory=set)


class DictLookup:
    """Lookup backend over a set of stored keys, counting leases."""

    def __init__(self) -> None:
        self.stored: set[bytes] = set()
        self.leases: set[str] = set()
        self.calls = 0
        self.rates: list[int] = []  # the engine prefill rate each lookup carried (0: none)
        self.lease_froms: list[int] = []  # the pages each lookup said the engine held (lease_from)
        self.budget_pages = 0  # > 0: a query budget of this many pages over the live leases
        self._held: dict[str, int] = {}  # lease -> pages
        self._n = 0

    def lookup(self, ks, *, lease=False, lease_ms=0, recompute_tokens_per_s=0, lease_from=0) -> LookupResult:
        """As the peer: the hit is the stored prefix from page 0; a lease and
        the budget take only the pages from lease_from on."""
        self.calls += 1
        self.rates.append(recompute_tokens_per_s)
        self.lease_froms.append(lease_from)
        hit = 0
        for k in ks:
            if k not in self.stored:
                break
            hit += 1
        held = min(lease_from, hit)
        lid, cut = "", 0
        if lease and self.budget_pages:
            left = max(0, self.budget_pages - sum(self._held.values()))
            leased = min(hit - held, left)
            hit, cut = held + leased, hit - held - leased
        if lease and hit > held:
            self._n += 1
            lid = f"lease-{self._n}"
            self.leases.add(lid)
            self._held[lid] = hit - held
        return LookupResult(hit, dram=hit - held, lease_id=lid, budget_cut_pages=cut)

    def release(self, lease_id: str) -> None:
        self.leases.discard(lease_id)
        self._held.pop(lease_id, None)

    def store_prefix(self, layout: keys.Layout, tokens: list[int]) -> None:
        self.stored.update(keys.chain(layout.fingerprint(), layout.page_tokens, tokens))
