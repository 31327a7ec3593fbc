"""The connector's scheduler half (runs in vLLM's EngineCore process).

It computes page keys from prompt token ids, asks the peer how many leading
pages it holds (taking a lease), decides external hits (ending on a page
boundary; starting where vLLM's own prefix hit ends, inside a page if need
be, whose locally computed blocks the load skips), drives the restore admission gate (orbitkv.gate), and plans the
loads and saves each step's metadata carries to the workers. A page whose
load failed is not offered again to its request, nor for a while to others
(orbitkv.vllm.failed_pages): the blocks the workers report failed
(KVConnectorOutput.invalid_block_ids) name it.

Keys cover what vLLM's own prefix cache keys a block on beside its tokens
(request_extras: the LoRA adapter, multimodal inputs, the cache salt), so a
request never gets KV computed for another adapter, image or tenant. A
request whose extras cannot be keyed (prompt embeddings, a multimodal input
without an identifier) is a miss and saves nothing.
"""

from __future__ import annotations

import collections
import concurrent.futures as cf
import dataclasses
import logging
import time
from typing import Any, Callable, Optional, Protocol, Sequence

from orbitkv import errors, keys
from orbitkv.client import SKIP_BLOCK, LookupResult
from orbitkv.gate import Admission, RestoreGate
from orbitkv.vllm import pd
from orbitkv.vllm._compat import block_ids_of
from orbitkv.vllm.fences import SaveFences, handed_blocks
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.failed_pages import FailedPages
from orbitkv.vllm.metadata import LoadSpec, OrbitKVMetadata, SaveSpec
from orbitkv.vllm.prefill_rate import PrefillRate

log = logging.getLogger(__name__)

# A hit the query budget cut short while other waiting requests' leases pin
# the budget (they hold no admission, so no release ends the deferral) asks
# again after BUDGET_RETRY_S. Whatever it waits for (those leases, or
# restores holding admission, whose releases end the deferral), it stops
# waiting BUDGET_WAIT_S after its first deferral for the budget: it then
# takes the hit it gets and recomputes the rest.
BUDGET_RETRY_S = 0.05
BUDGET_WAIT_S = 0.5


class LookupBackend(Protocol):
    """``available`` (optional, default True): False while the peer is
    unreachable or the session not open; lookups then report misses
    without a call and no saves are planned."""

    def lookup(self, keys: Sequence[bytes], *, lease: bool = False, lease_ms: int = 0,
               recompute_tokens_per_s: int = 0, lease_from: int = 0) -> LookupResult: ...

    def release(self, lease_id: str) -> None: ...


@dataclasses.dataclass
class _Lookup:
    hit_pages: int  # min over ranks, at most the pages a load may cover (_max_pages)
    leases: dict[int, str]
    at: float
    expires_ms: int  # earliest lease expiry (unix ms), 0 = none
    budget_cut: int = 0  # pages the peer left out for the query budget (max over ranks)
    lease_from: int = 0  # leading pages the engine held at the lookup: not leased
    tiers: tuple[int, int, int] = (0, 0, 0)  # rank 0's hit pages from lease_from on in (DRAM, SSD, remote)
    held_pages: int = 0  # min over ranks of every whole page the lookup named: what need not be saved again

    @property
    def leased_pages(self) -> int:
        return max(0, self.hit_pages - self.lease_from)


@dataclasses.dataclass
class _Req:
    req_id: str
    tokens: list[int]
    keys: dict[int, list[bytes]] = dataclasses.field(default_factory=dict)
    lookup: Optional[_Lookup] = None
    first_page: int = 0  # first page the external hit covers
    skip_blocks: int = 0  # leading blocks of first_page vLLM computed itself (not loaded)
    block_ids: list[int] = dataclasses.field(default_factory=list)
    saved_pages: int = 0  # pages [0, saved_pages) are in the peer or being saved
    loading: bool = False  # an async load is in flight (until finished_recving)
    sync_load: bool = False  # a sync load was planned for the next step
    finished: bool = False
    deferred_epoch: Optional[int] = None  # the gate's epoch when this request was last deferred
    deferred_until: Optional[float] = None  # a deferral for other requests' leases also ends then
    budget_wait_since: Optional[float] = None  # first deferral for the budget since the last uncut lookup
    failed_at: Optional[int] = None  # first page whose load failed for this request: never offered again
    extras: Optional[keys.Extras] = None  # what the keys cover beside the tokens (request_extras)
    unkeyed: str = ""  # why the request cannot be keyed ("" = it can): a miss, nothing saved
    # P/D (orbitkv.vllm.pd): a producer's handoff also saves the prompt's partial
    # last page (the tail); a consumer's handed-off request may load the whole
    # prompt, tail included (its chain then ends with the tail's key).
    hands_off: bool = False
    whole: bool = False
    tail_saved: bool = False
    tail_keys: dict[int, bytes] = dataclasses.field(default_factory=dict)
    sources: dict[str, int] = dataclasses.field(default_factory=dict)  # the planned load's tokens by tier (hit_sources)
    request: Any = None  # vLLM's Request (num_publishable_block_hashes), None when first seen scheduled
    # A resident prompt's lookup, off the scheduler's critical path (_ask_resident):
    # its question and the RPC's future, settled when the request is scheduled.
    pending: Optional[tuple[_Ask, cf.Future]] = None


@dataclasses.dataclass
class _Ask:
    """One lookup's question: each rank's chain and the call's arguments."""
    chains: dict[int, list[bytes]]
    max_pages: int
    held: int
    extra: dict[str, int]
    named: int  # pages the chains name (the hit's upper bound)


def request_extras(request: Any, salt_known: bool = True) -> tuple[Optional[keys.Extras], str]:
    """What vLLM keys its prefix cache on beside the tokens, as page-key
    extras (orbitkv.keys.Extras), mirroring vLLM 0.26's
    generate_block_hash_extra_keys: the LoRA adapter's name (and path); each
    multimodal input's identifier with its placeholder range (a page carries
    the inputs it overlaps); the cache salt (page 0). Returns (None, why)
    where they cannot be keyed: prompt embeddings, a multimodal input without
    an identifier or range, multimodal inputs in a form this vLLM no longer
    uses, or a salt ``request`` does not tell (``salt_known`` False: vLLM's
    NewRequestData carries none)."""
    if getattr(request, "prompt_embeds", None) is not None:
        return None, "prompt embeddings"
    if getattr(request, "prompt_token_ids", None) is None:
        return None, "no prompt token ids"
    lora = None
    lr = getattr(request, "lora_request", None)
    if lr is not None:
        name, path = getattr(lr, "lora_name", None), getattr(lr, "lora_path", None) or ""
        if not isinstance(name, str) or not isinstance(path, str):
            return None, "a LoRA adapter without a name"
        lora = keys.LoRA(name, path)
    mm = []
    feats = getattr(request, "mm_features", None)
    for f in feats or ():
        ident, pos = getattr(f, "identifier", None), getattr(f, "mm_position", None)
        offset, length = getattr(pos, "offset", None), getattr(pos, "length", None)
        if not isinstance(ident, str) or not ident or not isinstance(offset, int) or not isinstance(length, int):
            return None, "a multimodal input without an identifier or range"
        mm.append(keys.MMInput(ident, offset, length))
    if not feats and any(getattr(request, a, None) for a in ("mm_hashes", "mm_positions", "mm_inputs", "mm_kwargs")):
        return None, "multimodal inputs without mm_features"
    if not hasattr(request, "cache_salt") and not salt_known:
        return None, "an unknown cache salt"
    salt = getattr(request, "cache_salt", None)
    if salt is not None and not isinstance(salt, str):
        return None, "a cache salt that is not a string"
    x = keys.Extras(lora=lora, mm=tuple(mm), salt=salt or "")
    try:  # page() checks every input: what the keys cannot hold fails here, not mid-chain
        x.page(0, 1)
    except keys.ExtrasError as e:
        return None, str(e)
    return (None if x.empty else x), ""


_MAX_UNREPORTED = 8  # steps built ahead of their report (vLLM's batch queue holds two)


class SchedulerHalf:
    """Scheduler-side state. ``backend`` does lookups/releases (a control
    session in production, a fake in tests); ``clock`` returns seconds."""

    def __init__(self, cfg: ConnectorConfig, backend: LookupBackend, clock: Callable[[], float] = time.monotonic,
                 *, skipped_first: bool = False, capacity_blocks: int = 0) -> None:
        """``skipped_first`` and ``capacity_blocks`` (the engine's cache in
        blocks) turn on the gate's queue-aware mode (orbitkv.gate): the
        connector sets them for a vLLM whose scheduler visits skipped
        requests first."""
        self.cfg = cfg
        self.backend = backend
        self.clock = clock
        self.gate = RestoreGate(enabled=cfg.gate, skipped_first=skipped_first, capacity_blocks=capacity_blocks)
        self._fps = {r: cfg.layout.with_rank(r).fingerprint() for r in range(max(1, cfg.layout.tp_size))}
        self._reqs: dict[str, _Req] = {}
        self._loads: list[LoadSpec] = []
        self._after_step: list[_Lookup] = []  # leases of sync loads planned into the step being built
        # Per step built and not yet reported, oldest first: its sync loads and their leases.
        # vLLM reports steps in the order it built them, but with async scheduling it builds
        # step N+1 before it reports step N: a step's sync loads end with its own report.
        self._unreported: collections.deque[tuple[set[str], list[_Lookup]]] = collections.deque()
        self.failed = FailedPages()  # pages whose load failed: offered again only within bounds
        self._pending: dict[str, LoadSpec] = {}  # loads whose outcome the workers have not reported yet
        self.prefill = PrefillRate()  # the engine's prefill tokens/s, from the steps it plans
        self._step_prefill = 0  # prompt tokens the step being planned computes
        self._unkeyed_seen: set[str] = set()  # reasons a request could not be keyed, logged once each
        self.fences = SaveFences(workers=max(1, cfg.layout.tp_size))  # early_free (orbitkv.vllm.fences)
        self.frees = {"delayed_frees": 0, "early_frees": 0, "flushes": 0}  # since the last take_free_stats
        self.frees_total = dict(self.frees)  # since the start
        # Resident prompts' lookups run here, beside vLLM's scheduling (_ask_resident).
        self._lookups = cf.ThreadPoolExecutor(max_workers=1, thread_name_prefix="orbitkv-lookup")

    # --- keys and lookups ----------------------------------------------------

    def _req(self, request: Any) -> _Req:
        rid = str(request.request_id)
        st = self._reqs.get(rid)
        if st is None:
            st = self._new_req(rid, request, salt_known=True)
        return st

    def _new_req(self, rid: str, request: Any, salt_known: bool) -> _Req:
        extras, why = request_extras(request, salt_known)
        tokens = getattr(request, "prompt_token_ids", None)
        st = _Req(rid, list(map(int, tokens)) if tokens is not None else [], extras=extras, unkeyed=why,
                  request=request if hasattr(request, "num_publishable_block_hashes") else None)
        st.hands_off = self.cfg.saves and pd.wants_handoff(self.cfg.kv_role, request)
        # A full-prompt hit only with async loads: vLLM then computes the last token
        # again itself (_update_waiting_for_remote_kv); a sync hit must leave one. Such a
        # handoff loads async even where other hits load inside the step (_async).
        st.whole = (self.cfg.kv_role != "kv_producer" and self.cfg.handoff_async
                    and pd.whole_prompt(getattr(request, "kv_transfer_params", None)))
        if why and why not in self._unkeyed_seen:
            self._unkeyed_seen.add(why)
            log.warning("orbitkv: a request with %s cannot be keyed: it is a miss and none of its pages are "
                        "saved (said once per reason)", why)
        self._reqs[rid] = st
        return st

    def _keys(self, st: _Req, rank: int) -> list[bytes]:
        ks = st.keys.setdefault(rank, [])
        return keys.extend_chain(self._fps[rank], self.cfg.layout.page_tokens, st.tokens, ks, st.extras)

    def _tail_key(self, st: _Req, rank: int) -> Optional[bytes]:
        """The key of the prompt's partial last page (keys.tail_key), None for
        a page-aligned prompt."""
        pt = self.cfg.layout.page_tokens
        n = len(st.tokens)
        if n % pt == 0:
            return None
        k = st.tail_keys.get(rank)
        if k is None:
            full = self._keys(st, rank)
            i = n // pt
            extra = st.extras.page(i, pt) if st.extras is not None else b""
            k = st.tail_keys[rank] = keys.tail_key(self._fps[rank], full[-1] if full else keys.ZERO_KEY,
                                                   st.tokens[i * pt:], extra)
        return k

    def _chain(self, st: _Req, rank: int) -> list[bytes]:
        """The keys a lookup or load of the request names: its whole pages, and
        for a handed-off request that may load the whole prompt (st.whole) the
        tail's key after them."""
        ks = self._keys(st, rank)
        tail = self._tail_key(st, rank) if st.whole else None
        return ks + [tail] if tail is not None else ks

    def _max_pages(self, st: _Req) -> int:
        """Pages a hit may cover: every one of the chain for st.whole (vLLM
        computes the last token again after an async load), else those
        before the last prompt token's page."""
        pt, n = self.cfg.layout.page_tokens, len(st.tokens)
        return -(-n // pt) if st.whole else (n - 1) // pt

    def _available(self) -> bool:
        return bool(getattr(self.backend, "available", True))

    def _release(self, lk: Optional[_Lookup]) -> None:
        for lease in (lk.leases.values() if lk else ()):
            try:
                self.backend.release(lease)
            except errors.OrbitKVError as e:
                log.debug("release lease %s: %s", lease, e)

    def _fresh(self, lk: _Lookup) -> bool:
        """Whether a cached lookup may answer again: while its leases live, or
        for lookup_refresh_s when it holds none (a miss, a hit vLLM's own
        cache holds whole, remote pages): pages saved since may extend it."""
        if not lk.leases:
            return self.clock() - lk.at < self.cfg.lookup_refresh_s
        return lk.expires_ms == 0 or lk.expires_ms - time.time() * 1000 > 1000

    def _lookup(self, st: _Req, max_pages: int, held: int) -> _Lookup:
        """The request's lookup, leased from page ``held`` on (the engine holds
        the pages before it: vLLM's own prefix cache); a live one is reused
        while it leases every page past what the engine holds now."""
        held = min(held, max_pages)
        if st.lookup is not None and self._fresh(st.lookup) and st.lookup.lease_from <= held:
            return st.lookup
        self._release(st.lookup)
        st.lookup = None
        ask = self._ask(st, max_pages, held)
        return self._answer(st, ask, self._call(ask))

    def _ask(self, st: _Req, max_pages: int, held: int) -> _Ask:
        """The lookup's question. A prompt that ends on a whole page: the lookup
        names that page too, though no load covers it (vLLM computes the last
        token), so a held one is not saved again. Nothing past what the engine
        holds can load (a resident prompt): nothing to lease."""
        named = max(max_pages, len(st.tokens) // self.cfg.layout.page_tokens)
        rate = self.recompute_rate()
        extra = {"recompute_tokens_per_s": rate} if rate else {}
        if held:
            extra["lease_from"] = held
        return _Ask({rank: self._chain(st, rank)[:named] for rank in self._fps}, max_pages, held, extra, named)

    def _call(self, ask: _Ask) -> list[LookupResult]:
        """The lookup RPCs, one per rank (touches no scheduler state: may run
        on the lookup thread)."""
        return [self.backend.lookup(ks, lease=ask.held < ask.max_pages, lease_ms=self.cfg.lease_ms, **ask.extra)
                for ks in ask.chains.values()]

    def _answer(self, st: _Req, ask: _Ask, results: Sequence[LookupResult]) -> _Lookup:
        """st's lookup from the peer's answers to ask."""
        max_pages, held = ask.max_pages, ask.held
        hit, leases, expires, cut, tiers = ask.named, {}, 0, 0, (0, 0, 0)
        for rank, res in zip(ask.chains, results):
            if rank == 0:
                tiers = (int(getattr(res, "dram", 0) or 0), int(getattr(res, "ssd", 0) or 0),
                         int(getattr(res, "remote", 0) or 0))
            if res.lease_id:
                leases[rank] = res.lease_id
                if res.lease_expires_unix_ms:
                    expires = res.lease_expires_unix_ms if not expires else min(expires, res.lease_expires_unix_ms)
            hit = min(hit, res.hit_pages)
            cut = max(cut, int(getattr(res, "budget_cut_pages", 0) or 0))
        held_pages, hit = hit, min(hit, max_pages)
        self.failed.listed(self._chain(st, 0)[:max_pages], hit)
        st.lookup = _Lookup(hit, leases, self.clock(), expires, cut, held, tiers, held_pages)
        return st.lookup

    def _offer(self, st: _Req, lk: Optional[_Lookup]) -> int:
        """The lookup's hit less the pages that failed to load (FailedPages)."""
        if lk is None:
            return 0
        return self.failed.offer(self._chain(st, 0)[:lk.hit_pages], lk.hit_pages, self.clock(), st.failed_at)

    def _still_deferred(self, st: _Req) -> bool:
        if st.deferred_epoch is None or st.deferred_epoch != self.gate.epoch:
            return False
        return st.deferred_until is None or self.clock() < st.deferred_until

    def _others_lease(self, req_id: str, pages: int) -> bool:
        """Whether other requests' live leases (their requests wait for blocks,
        or their loads have not ended) hold at least ``pages`` pages: the
        budget they pin frees without a hold released, and would then cover
        the cut. Expired leases hold nothing; a chain the whole budget
        cannot hold waits for no one."""
        now_ms = time.time() * 1000
        held = sum(o.lookup.leased_pages for o in self._reqs.values()
                   if o.req_id != req_id and o.lookup is not None and o.lookup.leases
                   and (o.lookup.expires_ms == 0 or o.lookup.expires_ms > now_ms))
        return held >= pages

    def _may_wait_for_budget(self, st: _Req) -> bool:
        now = self.clock()
        if st.budget_wait_since is None:
            st.budget_wait_since = now
        return now - st.budget_wait_since < BUDGET_WAIT_S

    def peek_hit(self, request: Any, max_pages: int) -> int:
        """Leading pages of the request's first max_pages the peer holds for
        every TP rank, by a lookup without a lease (orbitkv.vllm.pd polls it
        while a handed-off request's pages arrive); 0 while the peer is down."""
        if max_pages <= 0 or not self._available():
            return 0
        st = self._req(request)
        if st.unkeyed:
            return 0
        hit = max_pages
        for rank in self._fps:
            hit = min(hit, self.backend.lookup(self._chain(st, rank)[:max_pages]).hit_pages)
        return hit

    def planned_pages(self, request: Any) -> int:
        """Pages of the request in the peer or being saved (0 if unknown)."""
        st = self._reqs.get(str(request.request_id))
        return st.saved_pages if st is not None else 0

    def planned_tail(self, request: Any) -> int:
        """Tokens of the request's tail (partial last page) saved or being
        saved for a handoff (0: none)."""
        st = self._reqs.get(str(request.request_id))
        return len(st.tokens) % self.cfg.layout.page_tokens if st is not None and st.tail_saved else 0

    def recompute_rate(self) -> int:
        """The engine's prefill rate the peer should weigh SSD restores
        against: as measured from this engine's steps, else as configured
        (recompute_tokens_per_s), else 0 (unknown: restore everything)."""
        measured = self.prefill.rate
        return int(measured) if measured else int(self.cfg.recompute_tokens_per_s)

    # --- vLLM scheduler API --------------------------------------------------

    def get_num_new_matched_tokens(self, request: Any, num_computed_tokens: int) -> tuple[Optional[int], bool]:
        st = self._req(request)
        if self._still_deferred(st):
            return None, False  # no hold released since this request was deferred: still deferred, no call
        st.deferred_epoch = st.deferred_until = None
        pt = self.cfg.layout.page_tokens
        n = len(st.tokens)
        # Keep at least one prompt token to compute (never cover the whole prompt),
        # unless vLLM computes it again itself (a handoff's async load: _max_pages).
        max_pages = self._max_pages(st)
        if self._resident(st, max_pages, num_computed_tokens):
            return self._ask_resident(st, max_pages, num_computed_tokens // pt)
        st.pending = None  # vLLM's own cache lost pages since a resident visit: this lookup decides
        lk = None
        if max_pages > 0 and self._available() and not st.unkeyed:  # peer down or unkeyable: a miss, no call
            try:
                lk = self._lookup(st, max_pages, num_computed_tokens // pt)
            except (errors.PeerUnavailable, errors.SessionLost) as e:
                log.debug("orbitkv lookup for %s failed, recomputing: %s", st.req_id, e)
            except errors.OrbitKVError as e:
                log.warning("orbitkv lookup for %s failed, recomputing: %s", st.req_id, e)
        hit = self._offer(st, lk)
        restores = lk is not None and num_computed_tokens % self.cfg.block_tokens == 0 and hit > num_computed_tokens // pt
        blocks = -(-n // self.cfg.block_tokens) if restores else 0
        # A hit the query budget cut short while other restores or waiting
        # requests' leases pin it: wait for them (bounded, BUDGET_WAIT_S) rather
        # than recompute the rest.
        cut = restores and lk.budget_cut > 0 and self.gate.enabled
        if not cut:
            st.budget_wait_since = None  # a later cut may wait again
        holders = cut and self.gate.others_hold(st.req_id) and self._may_wait_for_budget(st)
        leased = cut and not holders and self._others_lease(st.req_id, lk.budget_cut) and self._may_wait_for_budget(st)
        verdict = self.gate.defer_for_budget() if holders or leased else self.gate.query(st.req_id, blocks)
        if verdict == Admission.DEFER:
            # A deferred request holds no lease (no budget): it looks up again once a hold is released.
            self._release(st.lookup)
            st.lookup = None
            st.deferred_epoch = self.gate.epoch
            if leased:
                st.deferred_until = self.clock() + BUDGET_RETRY_S
            return None, False
        # Pages not offered (failed to load) are saved again once computed; a whole last
        # page the peer holds (named by the lookup, never loaded) is not.
        held = lk.held_pages if lk is not None and hit == lk.hit_pages else hit
        st.saved_pages = min(held, n // pt)
        # The local prefix hit may end inside a page (blocks are smaller than
        # pages): the external hit then starts there, the first page loaded
        # with its locally computed leading blocks skipped (never written).
        if lk is None or num_computed_tokens % self.cfg.block_tokens:
            return 0, False
        first = num_computed_tokens // pt
        if hit <= first:
            return 0, False
        st.first_page = first
        st.skip_blocks = (num_computed_tokens - first * pt) // self.cfg.block_tokens
        return min(hit * pt, n) - num_computed_tokens, self._async(st)

    def _resident(self, st: _Req, max_pages: int, num_computed_tokens: int) -> bool:
        """Whether vLLM's own prefix cache holds every page a hit could load, so
        that a lookup can only tell which pages the peer holds already (which
        the saves then skip), and none cached answers that."""
        if max_pages <= 0 or num_computed_tokens // self.cfg.layout.page_tokens < max_pages:
            return False
        if st.pending is not None:
            return True
        fresh = st.lookup is not None and self._fresh(st.lookup)
        return not fresh and self._available() and not st.unkeyed

    def _ask_resident(self, st: _Req, max_pages: int, held: int) -> tuple[Optional[int], bool]:
        """A resident prompt: no hit to wait for. Its lookup runs on the lookup
        thread, beside the rest of vLLM's scheduling step, and is settled when
        the request is scheduled (_settle), before any of its pages is saved:
        a lookup RPC after an idle spell took 1.4–2.4 ms of a resident 8K
        prompt's 23–29-ms TTFT on an H100 host (docs/benchmarks.md)."""
        if self.gate.query(st.req_id, 0) == Admission.DEFER:
            st.deferred_epoch = self.gate.epoch
            return None, False
        st.budget_wait_since = None
        if st.pending is None:
            self._release(st.lookup)
            st.lookup = None
            ask = self._ask(st, max_pages, min(held, max_pages))
            st.pending = (ask, self._lookups.submit(self._call, ask))
        return 0, False

    def _settle(self, st: _Req) -> None:
        """Applies a resident prompt's lookup (_ask_resident): the pages the
        peer holds are not saved again. One that failed or did not answer in
        timeout_s leaves them to be saved (the peer keeps one copy of a page)."""
        ask, fut = st.pending
        st.pending = None
        try:
            results = fut.result(timeout=self.cfg.timeout_s)
        except (errors.OrbitKVError, cf.TimeoutError, cf.CancelledError) as e:
            log.debug("orbitkv lookup for resident %s failed, saving its pages: %s", st.req_id, e)
            return
        lk = self._answer(st, ask, results)
        hit = self._offer(st, lk)
        held = lk.held_pages if hit == lk.hit_pages else hit
        st.saved_pages = max(st.saved_pages, min(held, len(st.tokens) // self.cfg.layout.page_tokens))

    def _async(self, st: _Req) -> bool:
        """Whether st's load runs between steps: a whole-prompt handoff's always
        (its hit covers the last page), others as the config says."""
        return st.whole or self.cfg.async_load

    def hit_sources(self, request: Any, num_external_tokens: int) -> dict[str, int]:
        """The request's external hit (the load planned by
        update_state_after_alloc) in tokens by where the peer said its pages
        were: "host" (its DRAM), "disk" (its SSD), "p2p" (another peer's),
        vLLM 0.33's CacheHitSource values; "external_unspecified" for what it
        did not say. Sums to num_external_tokens."""
        if num_external_tokens <= 0:
            return {}
        st = self._reqs.get(str(request.request_id))
        got = dict(st.sources) if st is not None else {}
        if sum(got.values()) != num_external_tokens:
            return {"external_unspecified": num_external_tokens}
        return got

    def _plan_sources(self, st: _Req, pages: range, start: int, end: int) -> dict[str, int]:
        """Tokens [start, end) of the load of ``pages`` by tier. The lookup
        counts its hit's pages from lease_from (the load's first page) on by
        tier, not per page: the peer's own pages (DRAM, SSD) come before
        those only other peers hold, and DRAM ones are taken to come before
        SSD ones, which matters only for a partial first or last page."""
        pt = self.cfg.layout.page_tokens
        lk = st.lookup
        d, s, r = lk.tiers if lk is not None else (0, 0, 0)
        seq = ["host"] * d + ["disk"] * s + ["p2p"] * r
        out: dict[str, int] = {}
        for i, p in enumerate(pages):
            n = min((p + 1) * pt, end) - max(p * pt, start)
            if n > 0:
                src = seq[i] if i < len(seq) else "external_unspecified"
                out[src] = out.get(src, 0) + n
        return out

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        st = self._req(request)
        st.block_ids = block_ids_of(blocks)
        st.sources = {}
        if num_external_tokens <= 0:
            if not st.loading:
                self._release(st.lookup)
                if st.lookup:
                    st.lookup.leases = {}
            return
        pt, bpp = self.cfg.layout.page_tokens, self.cfg.blocks_per_page
        skip = st.skip_blocks
        first = st.first_page
        end = first * pt + skip * self.cfg.block_tokens + num_external_tokens  # a page boundary, or the prompt's end
        npages = -(-end // pt) - first
        pages = range(first, first + npages)
        blocks_per = [tuple(st.block_ids[p * bpp : (p + 1) * bpp]) for p in pages]
        # The tail page (a partial last page) fills the prompt's last blocks only:
        # the rest of its blob is skipped (orbitkv.vllm.pd).
        tail_blocks = -(-(end - (first + npages - 1) * pt) // self.cfg.block_tokens)
        if npages and end % pt and len(blocks_per[-1]) >= tail_blocks:
            blocks_per[-1] = blocks_per[-1][:tail_blocks] + (SKIP_BLOCK,) * (bpp - tail_blocks)
        if any(len(b) != bpp for b in blocks_per):
            raise RuntimeError(f"orbitkv: request {st.req_id} has {len(st.block_ids)} blocks, too few for pages {pages}")
        ks = {r: self._chain(st, r)[first : first + npages] for r in self._fps}
        st.sources = self._plan_sources(st, pages, end - num_external_tokens, end)
        leases = dict(st.lookup.leases) if st.lookup else {}
        spec = LoadSpec(st.req_id, first, ks, blocks_per, leases, sync=not self._async(st), skip_blocks=skip)
        self._loads.append(spec)
        self._pending[st.req_id] = spec
        st.loading = self._async(st)
        st.sync_load = not self._async(st)
        self.gate.allocated(st.req_id, num_external_tokens, self.clock(), blocks=-(-len(st.tokens) // self.cfg.block_tokens))

    def build_connector_meta(self, scheduler_output: Any) -> OrbitKVMetadata:
        meta = OrbitKVMetadata(loads=self._loads)
        self._loads = []
        sched = dict(getattr(scheduler_output, "num_scheduled_tokens", {}) or {})
        self._step_prefill = 0
        for nr in getattr(scheduler_output, "scheduled_new_reqs", []) or []:
            st = self._reqs.get(str(nr.req_id)) or self._adopt(nr)
            st.block_ids = block_ids_of(nr.block_ids)
            self._scheduled(st, int(nr.num_computed_tokens) + int(sched.get(nr.req_id, 0)), sched.get(nr.req_id, 0), meta)
        self._cached(scheduler_output, sched, meta)
        # Prompt tokens this step computes (decode tokens are not prefill work).
        self.prefill.step(self.clock(), self._step_prefill)
        meta.preempted = [str(r) for r in (getattr(scheduler_output, "preempted_req_ids", None) or ())]
        for rid in meta.preempted:
            self._preempted(rid)
        self._unreported.append(({sp.req_id for sp in meta.loads if sp.sync}, self._after_step))
        self._after_step = []
        while len(self._unreported) > _MAX_UNREPORTED:  # a step built and never reported: its loads and leases go
            ran, leases = self._unreported.popleft()
            for lk in leases:
                self._release(lk)
            self._pending = {r: sp for r, sp in self._pending.items() if not (sp.sync and r in ran)}
        if self.cfg.early_free:
            meta.released, meta.flush = self.fences.step(handed_blocks(scheduler_output, meta.loads, self.cfg.block_tokens))
            self._count_free("flushes", len(meta.flush))
        return meta

    def _count_free(self, name: str, n: int = 1) -> None:
        self.frees[name] += n
        self.frees_total[name] += n

    def take_free_stats(self) -> dict[str, int]:
        """How finished requests' blocks were freed since the last call."""
        out, self.frees = self.frees, dict.fromkeys(self.frees, 0)
        return out

    def _adopt(self, nr: Any) -> _Req:
        """A request first seen scheduled (never looked up): vLLM's
        NewRequestData tells no cache salt, so unless it does, its pages are
        not saved (request_extras)."""
        return self._new_req(str(nr.req_id), nr, salt_known=False)

    def _cached(self, so: Any, sched: dict, meta: OrbitKVMetadata) -> None:
        cr = getattr(so, "scheduled_cached_reqs", None)
        if cr is None:
            return
        if isinstance(cr, list):  # older vLLM: one object per request
            for c in cr:
                st = self._reqs.get(str(c.req_id))
                if st is None:
                    continue
                if getattr(c, "resumed_from_preemption", False):
                    st.block_ids = block_ids_of(c.new_block_ids)
                else:
                    st.block_ids.extend(block_ids_of(c.new_block_ids))
                n = sched.get(c.req_id, 0)
                self._scheduled(st, int(c.num_computed_tokens) + int(n), n, meta)
            return
        resumed_ids = set(getattr(cr, "resumed_req_ids", ()) or ())
        resumed_flags = list(getattr(cr, "resumed_from_preemption", []) or [])
        for i, rid in enumerate(cr.req_ids):
            st = self._reqs.get(str(rid))
            if st is None:
                continue
            new = cr.new_block_ids[i] if i < len(cr.new_block_ids) else None
            resumed = rid in resumed_ids or (i < len(resumed_flags) and resumed_flags[i])
            if resumed:
                st.block_ids = block_ids_of(new)
            elif new is not None:
                st.block_ids.extend(block_ids_of(new))
            done = int(cr.num_computed_tokens[i]) + int(sched.get(rid, 0))
            self._scheduled(st, done, sched.get(rid, 0), meta)

    def _scheduled(self, st: _Req, computed_after: int, num_tokens: int, meta: OrbitKVMetadata) -> None:
        if num_tokens <= 0:
            return
        if st.pending is not None:
            self._settle(st)
        self._step_prefill += max(0, min(computed_after, len(st.tokens)) - (computed_after - num_tokens))
        if st.sync_load and st.lookup is not None:
            st.sync_load = False
            self._after_step.append(st.lookup)  # the load runs in this step
            st.lookup = None
        self.gate.computed(st.req_id, self.clock())
        pt, bpp = self.cfg.layout.page_tokens, self.cfg.blocks_per_page
        upto = min(computed_after, len(st.tokens)) // pt
        upto = min(upto, len(st.block_ids) // bpp, self._publishable_pages(st))
        tail = st.hands_off and not st.tail_saved and computed_after >= len(st.tokens) and len(st.tokens) % pt > 0
        if upto <= st.saved_pages and not tail:
            return
        if not self._available():
            return  # peer down: no save (nor save hold); a later step saves these pages if it is back
        if not self.cfg.saves:
            return  # a kv_consumer never saves (nor holds a save): orbitkv.vllm.pd
        if st.unkeyed:
            return  # its pages have no key that tells them apart from another adapter's, image's or tenant's
        if upto > st.saved_pages:
            pages = range(st.saved_pages, upto)
            ks = {r: self._keys(st, r)[pages.start : pages.stop] for r in self._fps}
            blocks = [tuple(st.block_ids[p * bpp : (p + 1) * bpp]) for p in pages]
            meta.saves.append(SaveSpec(st.req_id, pages.start, ks, blocks))
            self.fences.saving(st.req_id, (b for page in blocks for b in page))
            st.saved_pages = upto
            self.gate.save_started(st.req_id)
        if tail:
            self._save_tail(st, meta)

    def _publishable_pages(self, st: _Req) -> int:
        """Pages whose blocks vLLM lets a content-addressed cache publish:
        vLLM's ``Request.num_publishable_block_hashes`` (in the base class's
        request_finished docstring since after 0.33: with EAGLE prefix-cache
        hashing the last block's hash is not final) where the request has it."""
        n = getattr(st.request, "num_publishable_block_hashes", None)
        if n is None:
            return len(st.tokens) // self.cfg.layout.page_tokens + 1
        return int(n) * self.cfg.block_tokens // self.cfg.layout.page_tokens

    def _save_tail(self, st: _Req, meta: OrbitKVMetadata) -> None:
        """A handoff's tail: the prompt's last (partial) page, computed in this
        step, saved under its tail key as a whole page blob. A save names every
        block of a page, so the blocks past the prompt's last repeat it (their
        part of the blob is never loaded: a load skips them). Its prompt slots
        are never written again while the request lives."""
        pt, bpp, bt = self.cfg.layout.page_tokens, self.cfg.blocks_per_page, self.cfg.block_tokens
        n = len(st.tokens)
        i = n // pt
        own = st.block_ids[i * bpp : i * bpp + -(-(n - i * pt) // bt)]
        if not own or len(own) * bt < n - i * pt:
            return  # the blocks are not known (never expected): no tail
        blocks = tuple(own) + (own[-1],) * (bpp - len(own))
        ks = {r: [self._tail_key(st, r)] for r in self._fps}
        meta.saves.append(SaveSpec(st.req_id, i, ks, [blocks]))
        self.fences.saving(st.req_id, blocks)
        st.tail_saved = True
        self.gate.save_started(st.req_id)

    def _preempted(self, rid: str) -> None:
        self.fences.preempted(rid)
        st = self._reqs.get(rid)
        if st is not None:
            st.block_ids = []

    def _load_outcomes(self, connector_output: Any, ran: set[str]) -> None:
        """Records the pages of pending loads whose blocks the workers report
        failed, and forgets the loads whose outcome is known now: sync loads
        that ran in the step just reported (``ran``), async ones that finished
        receiving."""
        invalid = set(getattr(connector_output, "invalid_block_ids", None) or ())
        for rid, spec in self._pending.items():
            page = _first_failed_page(spec, invalid)
            if page is None:
                continue
            self.failed.failed(spec.keys[0][page - spec.first_page], self.clock())
            st = self._reqs.get(rid)
            if st is not None:
                st.failed_at = page if st.failed_at is None else min(st.failed_at, page)
        done = {str(r) for r in getattr(connector_output, "finished_recving", None) or ()}
        self._pending = {r: sp for r, sp in self._pending.items() if not (sp.sync and r in ran) and r not in done}

    def update_connector_output(self, connector_output: Any) -> None:
        ran, leases = self._unreported.popleft() if self._unreported else (set(), [])
        for lk in leases:
            self._release(lk)
        self._load_outcomes(connector_output, ran)
        for rid in getattr(connector_output, "finished_recving", None) or ():
            rid = str(rid)
            self.gate.load_finished(rid)
            st = self._reqs.get(rid)
            if st is not None:
                st.loading = False
                self._release(st.lookup)
                st.lookup = None
                if st.finished:
                    self._reqs.pop(rid, None)
        for rid in getattr(connector_output, "finished_sending", None) or ():
            self.gate.saves_done(str(rid))
            self.fences.ended(str(rid))
        done = getattr(getattr(connector_output, "kv_connector_worker_meta", None), "reports", None)
        for rid in self.fences.reported(done or {}):
            self.gate.saves_done(rid)

    def request_finished(self, request: Any, block_ids: Any = None, *, keep: bool = False) -> tuple[bool, Optional[dict]]:
        """(delay, None): delay — vLLM keeps the blocks until the workers report
        the request's saves ended; with early_free (and not ``keep``: a P/D
        handoff) it frees them now and the saves' blocks are fenced instead."""
        rid = str(request.request_id)
        delay = self.gate.finished(rid, self.clock())
        if delay and self.cfg.early_free and not keep:
            self.fences.release(rid)
            delay = False
            self._count_free("early_frees")
        elif delay:
            self._count_free("delayed_frees")
        st = self._reqs.get(rid)
        if st is not None:
            st.finished = True
            if not st.loading:  # a load in flight keeps its lease until it ends
                self._release(st.lookup)
                self._reqs.pop(rid, None)
        return delay, None

    def shutdown(self) -> None:
        for st in self._reqs.values():
            self._release(st.lookup)
        for lk in self._after_step + [lk for _, lks in self._unreported for lk in lks]:
            self._release(lk)
        self._reqs.clear()
        self._after_step = []
        self._unreported.clear()
        self._pending.clear()
        self._lookups.shutdown(wait=False, cancel_futures=True)  # a call in flight ends by its timeout_s


def _first_failed_page(spec: LoadSpec, invalid: set[int]) -> Optional[int]:
    """The first page (of the request) of ``spec`` with a block in ``invalid``."""
    if not invalid:
        return None
    for i in range(len(spec)):
        if invalid.intersection(spec.loaded_blocks(i)):
            return spec.first_page + i
    return None
