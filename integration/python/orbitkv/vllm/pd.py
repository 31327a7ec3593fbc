"""Prefill/decode disaggregation: the connector's P/D roles (vLLM's ``kv_role``).

A prefill engine (``kv_producer``) computes a prompt and saves its pages into
its host's peer as each chunk is computed (the ordinary save path, DRAM
durability); when the request finishes, ``request_finished`` returns the
``kv_transfer_params`` a P/D proxy forwards to the decode engine (see
``handoff_params``). The decode engine (``kv_consumer``) gets the same prompt
with those params; its lookups find the pages on the producer's peer through
the gossiped catalog and load them (remote DRAM -> local DRAM -> engine). No
engine state is shared: the page keys follow from the prompt. The whole
prompt is handed over: the producer also saves its partial last page (the
tail, keyed by orbitkv.keys.tail_key, padded to a page blob) and a consumer
with async loads loads every page, tail included, so that its vLLM computes
only the last token again (docs/pd.md).

The producer's saves may still be in flight (or their announcements on the
way) when the decode request arrives, so a consumer polls lookups for a
handed-off request (``HandoffWait``: backoff between polls, a deadline,
``pd_wait_ms``) and answers vLLM "not yet" (``None``) meanwhile; at the
deadline it proceeds with what it found and recomputes the rest. Nothing
waits for the producer beyond that deadline: a dead or partitioned producer
costs recompute, never a hang. The producer holds a finished request's
blocks only until its own saves into its local peer are done (bounded by the
save deadline), never until a consumer has read them, so a consumer that
never comes leaks nothing.
"""

from __future__ import annotations

import dataclasses
import enum
import logging
import time
from typing import Any, Callable, Mapping, Optional

from orbitkv import errors

log = logging.getLogger(__name__)

# The kv_transfer_params keys OrbitKV reads and writes besides vLLM's own
# (do_remote_prefill, do_remote_decode, remote_engine_id, remote_host,
# remote_port, remote_block_ids, as vLLM's P/D connectors and proxies use).
PAGES = "orbitkv_pages"  # prompt pages the producer saved (the consumer expects them), the tail included
TAIL_TOKENS = "orbitkv_tail_tokens"  # tokens of the prompt's partial last page saved as its tail (0: none)
PAGE_TOKENS = "orbitkv_page_tokens"
MEMBER = "orbitkv_member"  # the producer peer's member name in the cluster


def handoff_params(engine_id: str, pages: int, page_tokens: int, member: Optional[Mapping[str, str]],
                   block_ids: Any = None, tail_tokens: int = 0) -> dict:
    """The kv_transfer_params a producer returns for a finished request.
    ``pages``: whole pages saved; ``tail_tokens``: tokens of the partial last
    page saved as the tail (counted in PAGES as one more page).
    ``member``: the producer peer's own entry (name, data address) or None
    when the peer could not say (standalone, unreachable)."""
    host, port = "", 0
    if member and member.get("data_addr"):
        host, _, p = member["data_addr"].rpartition(":")
        port = int(p) if p.isdigit() else 0
    return {
        "do_remote_prefill": True,
        "do_remote_decode": False,
        "remote_engine_id": engine_id,
        "remote_host": host,
        "remote_port": port,
        "remote_block_ids": list(block_ids or []),
        PAGES: int(pages) + (1 if tail_tokens > 0 else 0),
        PAGE_TOKENS: int(page_tokens),
        TAIL_TOKENS: int(tail_tokens),
        MEMBER: (member or {}).get("name", ""),
    }


def expected_pages(params: Optional[Mapping[str, Any]]) -> int:
    """Pages a handed-off request's params promise (0: not a handoff)."""
    if not params or not params.get("do_remote_prefill"):
        return 0
    try:
        return max(0, int(params.get(PAGES, 0)))
    except (TypeError, ValueError):
        return 0


def whole_prompt(params: Optional[Mapping[str, Any]]) -> bool:
    """Whether a handed-off request's producer hands over the whole prompt
    (its params name TAIL_TOKENS: this version's producers, the tail saved
    or the prompt page-aligned): the consumer may then load every page, the
    tail included, and vLLM computes only the last token again."""
    return bool(params and params.get("do_remote_prefill") and TAIL_TOKENS in params)


class Decision(enum.Enum):
    WAIT = "wait"  # ask again later (vLLM: get_num_new_matched_tokens returns None)
    PROCEED = "proceed"  # look up, load what is there, recompute the rest


@dataclasses.dataclass
class HandoffWait:
    """One handed-off request's wait for its pages: a pure state machine,
    time passed in. Polls start ``first_s`` apart and back off by ``factor``
    up to ``max_s``; at ``deadline`` it proceeds whatever was found."""

    expect: int
    deadline: float
    first_s: float = 0.005
    max_s: float = 0.2
    factor: float = 2.0
    next_poll: float = 0.0
    interval: float = 0.0
    polls: int = 0
    best: int = 0  # most pages any poll saw

    def due(self, now: float) -> bool:
        """Whether a lookup should be made now."""
        return now >= self.next_poll

    def observe(self, now: float, hit_pages: int) -> Decision:
        """A lookup made at ``now`` found ``hit_pages`` leading pages."""
        self.polls += 1
        self.best = max(self.best, hit_pages)
        if hit_pages >= self.expect or now >= self.deadline:
            return Decision.PROCEED
        self.interval = self.first_s if self.interval == 0 else min(self.max_s, self.interval * self.factor)
        self.next_poll = min(now + self.interval, self.deadline)
        return Decision.WAIT

    def expired(self, now: float) -> bool:
        return now >= self.deadline


class Handoffs:
    """The consumer side: which requests wait for their producer's pages.
    ``peek(request, max_pages)`` looks up without a lease (SchedulerHalf.peek_hit)."""

    def __init__(self, wait_ms: int, page_tokens: int, peek: Callable[[Any, int], int],
                 clock: Callable[[], float] = time.monotonic, whole: bool = True) -> None:
        """``whole``: the engine loads a handoff's whole prompt (async loads)."""
        self.whole = whole
        self.wait_s = wait_ms / 1000.0
        self.page_tokens = page_tokens
        self.peek = peek
        self.clock = clock
        self._waits: dict[str, HandoffWait] = {}
        self.timed_out = 0  # handoffs that proceeded at their deadline short of their pages
        self.completed = 0  # handoffs that found every page they expected

    def should_wait(self, request: Any) -> bool:
        """True: answer vLLM "not yet" for this request this step."""
        rid = str(request.request_id)
        w = self._waits.get(rid)
        now = self.clock()
        if w is None:
            n = len(request.prompt_token_ids)
            params = getattr(request, "kv_transfer_params", None)
            most = -(-n // self.page_tokens) if self.whole and whole_prompt(params) else (n - 1) // self.page_tokens
            expect = min(expected_pages(params), most)
            if expect <= 0:
                return False
            w = self._waits[rid] = HandoffWait(expect, now + self.wait_s)
        if not w.due(now):
            return True
        try:
            hit = self.peek(request, w.expect)
        except errors.OrbitKVError as e:  # the peer failed this poll: poll again until the deadline
            log.debug("orbitkv handoff lookup for %s failed: %s", rid, e)
            hit = 0
        if w.observe(now, hit) == Decision.WAIT:
            return True
        del self._waits[rid]
        if hit >= w.expect:
            self.completed += 1
        else:
            self.timed_out += 1
            log.warning("orbitkv handoff %s: %d of %d pages visible after %.0f ms; recomputing the rest",
                        rid, w.best, w.expect, self.wait_s * 1000)
        return False

    def forget(self, req_id: str) -> None:
        """The request finished or was aborted while waiting."""
        self._waits.pop(str(req_id), None)

    @property
    def waiting(self) -> int:
        return len(self._waits)


def wants_handoff(role: str, request: Any) -> bool:
    """Whether request_finished should return handoff params: always for a
    kv_producer, for kv_both when the proxy asked (do_remote_decode)."""
    if role == "kv_producer":
        return True
    params = getattr(request, "kv_transfer_params", None) or {}
    return role == "kv_both" and bool(params.get("do_remote_decode"))


def own_member(socket_path: str, timeout_s: float) -> Optional[dict]:
    """The peer's own cluster entry (name, data_addr) through its admin
    service on the engine socket: {} when the peer answered without one
    (standalone), None when it could not be asked (ask again later)."""
    import grpc

    from orbitkv._proto import admin_pb2, admin_pb2_grpc

    try:
        with grpc.insecure_channel("unix:" + socket_path) as ch:
            resp = admin_pb2_grpc.AdminServiceStub(ch).Peers(admin_pb2.PeersRequest(), timeout=timeout_s)
    except grpc.RpcError as e:
        log.debug("orbitkv: the peer's own member entry: %s", e)
        return None
    for p in resp.peers:
        if p.self:
            return {"name": p.name, "data_addr": p.data_addr}
    return {}
