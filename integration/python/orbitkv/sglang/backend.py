"""OrbitKV as an SGLang HiCache L3 storage backend.

Register with::

  --hicache-storage-backend dynamic --hicache-storage-backend-extra-config
  '{"backend_name":"orbitkv","module_path":"orbitkv.sglang",
    "class_name":"OrbitKVHiCacheStorage","interface_v1":1,"allocator":"shm",
    "socket":"/path/orbitkv.sock"}'

Memory path. With ``interface_v1`` set, if the host pool's kv_buffer is a shared file mapping
(or SGLang's ``"allocator":"shm"`` memfd pool, which the peer opens as /proc/PID/fd/N) with a
layout whose per-layer page is one dense block (layer_first,
page_first_direct), the pool itself is registered and the peer copies pages
straight in and out of host slots (zero copy). Otherwise — SGLang's default
pinned anonymous pool, or page_first — pages go through a shared-memory
staging buffer: ONE EXTRA HOST COPY per page (host pool <-> staging) on
every get and set. Extra config ``staging_pages`` (default 256) bounds it.

Keys. HiCache hands a backend only its page hashes (chained SHA-256 over
token ids, no namespace), never the tokens, so the OrbitKV key of a page is
SHA-256("orbitkv.sglang.v1" ‖ layout fingerprint ‖ hash bytes)[:16]: still
prefix-chained (through SGLang's hash) and isolated by layout (model,
dtype, rank, page size), and by pipeline stage, context-parallel rank and
host pool name where those are not the defaults. These keys never equal the
vLLM connector's.

Cache identity. SGLang keys its own radix cache on a request's ``extra_key``
(its cache salt, with the LoRA adapter's id appended), but SGLang 0.5.17
hashes storage pages over token ids only: two requests with equal tokens
and another adapter or salt get one page hash, so through any storage
backend they would share KV. (SGLang 0.5.23 seeds its storage hashes with
the extra_key and salt: ``storage_namespace_seed``.) Under an SGLang that
does not, the backend refuses a server with LoRA enabled (ValueError at
start, saying why) unless extra config ``"share_across_extra_keys": true``
says sharing is safe there; it cannot see salts at all (neither at start:
any client may send one, nor per page), so it warns at start that requests
with different cache salts share pages.

Multi-pool (v2) interface. ``register_mem_host_pool_v2`` gives every extra
pool (e.g. the speculative draft's KV) its own lane: a session, staging and
keys of its own. ``batch_exists_v2`` applies SGLang's hit policies the way
its HiCacheFile backend does. Pools other than MHA K/V pools (Mamba states,
MLA latents) are refused with NotImplementedError when registered.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from typing import Any, List, Optional, Sequence

from orbitkv import buffers, errors, keys
from orbitkv.client import Client, OpResult, PageRef, Session
from orbitkv.sglang import _compat, hostpool
from orbitkv.sglang._compat import (
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)
from orbitkv.sglang.staging import Staging

log = logging.getLogger(__name__)

_DOMAIN = b"orbitkv.sglang.v1"


def _hash_bytes(k: str) -> bytes:
    try:
        return bytes.fromhex(k)
    except ValueError:
        return k.encode("utf-8")


def _log_prefetch_budget(tokens: int) -> None:
    """Say how much SGLang restores from OrbitKV at once. SGLang 0.5.17 starts
    no prefetch from L3 while the prefetches in flight hold half its KV host
    pool's tokens (``prefetch_capacity_limit`` in its cache controller; one
    started below it is taken whole), each counting its prompt's whole
    uncached tail, and revokes one the pool has no room for: a host pool
    small beside the prompts served at once leaves pages OrbitKV holds
    recomputed (docs/journal/2026-12-02-sglang-h200.md, "Pairs, SSD, 8K
    recovery and the `l2` config")."""
    if tokens > 0:
        log.info("orbitkv: SGLang's host pool holds %d tokens; SGLang starts no prefetch from OrbitKV while "
                 "those in flight hold %d tokens (half of it), and recomputes those prompts: size --hicache-size "
                 "for the uncached prompt tokens served at once", tokens, tokens // 2)


def _truthy(v: Any) -> bool:
    return v is True or str(v).strip().lower() in ("1", "true", "yes", "on")


def storage_hashes_namespaced() -> bool:
    """Whether the installed SGLang seeds its storage page hashes with the
    request's extra_key and cache salt (0.5.23: mem_cache.utils.
    storage_namespace_seed), so pages of different salts and adapters
    never share a hash. False for 0.5.17 (token ids only) and without SGLang."""
    try:
        from sglang.srt.mem_cache import utils  # type: ignore
    except Exception:
        return False
    return callable(getattr(utils, "storage_namespace_seed", None))


def server_lora_enabled() -> Optional[bool]:
    """Whether the SGLang server this process runs serves LoRA adapters
    (--enable-lora or --lora-paths); None where its arguments are unknown."""
    try:
        from sglang.srt import server_args  # type: ignore

        args = server_args.get_global_server_args()
    except Exception:
        return None
    if args is None:
        return None
    return bool(getattr(args, "enable_lora", False) or getattr(args, "lora_paths", None))


def _check_cache_identity(share: bool, say: bool = True) -> None:
    """Refuses (ValueError) an SGLang whose storage hashes ignore extra_key
    when its server enables LoRA, unless ``share``; says at start what is
    not isolated (``say``: once per backend, not per extra pool)."""
    if storage_hashes_namespaced():
        if say:
            log.info("orbitkv: SGLang seeds its storage page hashes with each request's extra_key and cache salt: "
                     "pages of different adapters and salts never share an OrbitKV key")
        return
    why = ("this SGLang hashes HiCache storage pages over token ids only, never a request's extra_key (its "
           "cache_salt with the LoRA adapter's id appended): requests with equal tokens share OrbitKV pages across "
           "adapters and cache salts")
    if server_lora_enabled() and not share:
        raise ValueError(f"orbitkv HiCache backend refuses a server with LoRA enabled: {why}, so one adapter's "
                         "requests would be served KV another adapter computed. Set the extra config "
                         "\"share_across_extra_keys\": true only if that is safe here (docs/compatibility.md)")
    if not say:
        return
    if share:
        log.warning("orbitkv: %s; share_across_extra_keys is set: they do", why)
    else:
        log.warning("orbitkv: %s. Cache salts give no tenant isolation through OrbitKV under this SGLang; set "
                    "the extra config \"share_across_extra_keys\": true to acknowledge it (docs/compatibility.md)",
                    why)


class OrbitKVHiCacheStorage(HiCacheStorage):
    """HiCache L3 backend on the host's OrbitKV peer. Thread-safe: the
    controller's prefetch, prefetch-I/O and backup threads call it at once."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None,
                 pool_name: str = "kv") -> None:
        self.config = storage_config
        self.extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.extra.update(kwargs or {})
        if getattr(storage_config, "is_mla_model", False):
            raise NotImplementedError("OrbitKV pages need K and V planes; MLA latent caches are not supported yet")
        if getattr(storage_config, "should_split_heads", False):
            raise NotImplementedError("OrbitKV stores a rank's whole head slice per page; "
                                      "tp_lcm_size head splitting (page_head across TP sizes) is not supported yet")
        self.pool_name = str(pool_name)
        self._lanes: dict[str, "OrbitKVHiCacheStorage"] = {}
        self.socket = str(self.extra.get("socket", ""))
        if not self.socket:
            raise ValueError("orbitkv HiCache backend: extra config 'socket' is required")
        self.timeout_s = float(self.extra.get("timeout_s", 5.0))
        self.deadline_ms = int(self.extra.get("op_deadline_ms", 30000))
        self.share_across_extra_keys = _truthy(self.extra.get("share_across_extra_keys"))
        _check_cache_identity(self.share_across_extra_keys, say=self.pool_name == "kv")
        self.client: Optional[Client] = None
        self.session: Optional[Session] = None
        self.staging: Optional[Staging] = None
        self._fp = b""
        self._closed = False
        self._lock = threading.Lock()
        # SGLang's storage metrics (--enable-cache-report / storage metrics
        # on): pages and GB/s of each zero-copy get and set, handed over
        # and cleared by get_stats.
        self._metrics_on = bool(getattr(storage_config, "enable_storage_metrics", False))
        self._stats = _compat.StorageMetrics()
        self._stats_lock = threading.Lock()

    # --- setup --------------------------------------------------------------

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        self.mem_pool_host = mem_pool_host
        self.geo = g = hostpool.geometry(mem_pool_host)
        self.layout = keys.Layout(
            model=str(getattr(self.config, "model_name", None) or self.extra.get("model", "")),
            revision=str(self.extra.get("revision", "")),
            dtype=buffers.DTYPE_NAMES.get(str(g.dtype), str(g.dtype)),
            num_layers=g.layers,
            kv_heads=g.heads,
            head_dim=g.head_dim,
            tp_rank=int(getattr(self.config, "tp_rank", 0)),
            tp_size=int(getattr(self.config, "tp_size", 1)),
            page_tokens=g.page_size,
            byte_layout=hostpool.BYTE_LAYOUT,
        )
        self._fp = self.layout.fingerprint() + self._scope()
        desc = self._describe_direct()
        if desc is None:
            self.staging = Staging(g, int(self.extra.get("staging_pages", 256)))
            desc = buffers.describe_planes(self.staging.planes())
            log.info("orbitkv: host pool is not shared-file memory; staging %d pages (one extra copy)", self.staging.slots)
        if self.pool_name == "kv":  # SGLang's limit is the KV pool's (not an extra pool's, e.g. the draft's)
            _log_prefetch_budget(int(getattr(mem_pool_host, "size", 0) or 0))
        # Lazy: SGLang starts while the peer is down; until the session
        # opens (by itself) exists → 0, get → miss, set → False.
        self.client = Client(self.socket, timeout=self.timeout_s, lazy=True)
        self.session = self.client.open_session(
            self.layout, block_tokens=g.page_size, num_blocks=desc.num_blocks,
            buffers=desc.buffers, segments=desc.segments,
            engine_id=f"sglang-tp{self.layout.tp_rank}" + ("" if self.pool_name == "kv" else f"-{self.pool_name}"),
            lazy=True,
        )

    def _scope(self) -> bytes:
        """What else tells this rank's pages apart: the pipeline stage (two
        stages may hold the same number of layers), the context-parallel
        rank (each holds a slice of every page) and the host pool. Empty
        for the defaults, so single-stage KV keys keep their value."""
        c = self.config
        parts = []
        if int(getattr(c, "pp_size", 1) or 1) > 1:
            parts.append(f"pp={c.pp_rank}/{c.pp_size}")
        if int(getattr(c, "attn_cp_size", 1) or 1) > 1:
            parts.append(f"cp={c.attn_cp_rank}/{c.attn_cp_size}")
        if self.pool_name != "kv":
            parts.append(f"pool={self.pool_name}")
        return ("|" + "|".join(parts)).encode() if parts else b""

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """Registers one of the host pools of SGLang's multi-pool interface.
        The KV pool is this backend itself; any other gets its own lane.
        NotImplementedError for pools that are not MHA K/V pools."""
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        name = str(host_pool_name)
        if name == str(PoolName.KV):
            if getattr(self, "mem_pool_host", None) is not host_pool:
                self.register_mem_pool_host(host_pool)
            return
        if name in self._lanes:
            raise ValueError(f"orbitkv: host pool {name!r} is already registered")
        lane = OrbitKVHiCacheStorage(self.config, dict(self.extra), pool_name=name)
        lane.register_mem_pool_host(host_pool)
        self._lanes[name] = lane

    def _lane(self, name: Any) -> "OrbitKVHiCacheStorage":
        n = str(name)
        if n == str(PoolName.KV):
            return self
        try:
            return self._lanes[n]
        except KeyError:
            raise KeyError(f"orbitkv: host pool {n!r} was not registered (register_mem_host_pool_v2)") from None

    def _describe_direct(self) -> Optional[buffers.KVDescription]:
        if not self.extra.get("interface_v1") or str(self.extra.get("force_staging", "")).lower() in ("1", "true"):
            return None  # the legacy get/set interface copies through staging anyway
        planes = hostpool.direct_planes(self.mem_pool_host, self.geo)
        if planes is None:
            return None
        try:
            return buffers.describe_planes(planes)
        except errors.NotFileBacked:
            return None

    @property
    def zero_copy(self) -> bool:
        return self.staging is None

    def key(self, k: str) -> bytes:
        return hashlib.sha256(_DOMAIN + self._fp + _hash_bytes(k)).digest()[: keys.KEY_SIZE]

    def _sess(self) -> Session:
        if self.session is None:
            raise errors.FailedPrecondition("register_mem_pool_host was not called")
        return self.session

    # --- existence ------------------------------------------------------------

    @property
    def available(self) -> bool:
        """Whether the peer session is open and the peer reachable."""
        return self.session is not None and self.session.ready

    def batch_exists(self, keys_: List[str], extra_info: Any = None) -> int:
        if not keys_ or not self.available:
            return 0
        try:
            return self._sess().lookup([self.key(k) for k in keys_]).hit_pages
        except errors.OrbitKVError as e:
            log.warning("orbitkv batch_exists: %s", e)
            return 0

    def exists(self, key: str) -> bool:
        return self.batch_exists([key]) == 1

    # --- multi-pool (v2) interface ----------------------------------------------

    def batch_exists_v2(self, keys_: List[str], pool_transfers: Optional[List[PoolTransfer]] = None,
                        extra_info: Any = None) -> PoolTransferResult:
        """The usable prefix, as SGLang's HiCacheFile decides it. The KV
        pool: its leading pages present. ALL_PAGES: that pool holds every
        page of the prefix. TRAILING_PAGES: it holds the last
        len(transfer.keys) pages of it, so a trailing state may restore 5
        pages and not 4. SGLang 0.5.23 takes the set of restorable lengths
        (``restorable_prefix_pages``, intersected over TP ranks): the usable
        prefix is the longest length every pool restores. SGLang 0.5.17
        takes one length: the shortest of the pools' longest."""
        kv = self.batch_exists(keys_)
        hits: dict[str, int] = {PoolName.KV: kv} if kv else {}
        sets = _compat.RESTORABLE_SETS
        restorable, final = set(range(1, kv + 1)), kv
        for t in pool_transfers or []:
            if final == 0:
                break
            lane = self._lane(t.name)
            if t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                ok = lane._trailing_restorable(keys_[:kv], max(1, len(t.keys or [])), every=sets)
            else:
                ok = set(range(1, lane.batch_exists(keys_[:kv]) + 1))
            if ok:
                hits[t.name] = max(ok)
            restorable &= ok
            final = max(restorable, default=0) if sets else min(final, max(ok, default=0))
        if not sets:
            return PoolTransferResult(final, hits)
        return PoolTransferResult(final, hits, sorted(restorable))

    def _trailing_restorable(self, keys_: List[str], trailing: int, every: bool) -> set[int]:
        """The prefix lengths n of keys_ whose last ``trailing`` pages this
        lane holds (``every``; else only the longest). Top down: a window
        missing a page skips every length whose window holds that page."""
        out: set[int] = set()
        n = len(keys_)
        while n > 0:
            lo = max(0, n - trailing)
            got = self.batch_exists(keys_[lo:n])
            if got < n - lo:
                n = lo + got  # keys_[lo + got] is missing
                continue
            out.add(n)
            if not every:
                break
            n -= 1
        return out

    def batch_get_v2(self, transfers: List[PoolTransfer], extra_info: Any = None) -> dict:
        return {t.name: self._lane(t.name).batch_get_v1(list(t.keys or []), t.host_indices) for t in transfers}

    def batch_set_v2(self, transfers: List[PoolTransfer], extra_info: Any = None) -> dict:
        return {t.name: self._lane(t.name).batch_set_v1(list(t.keys or []), t.host_indices) for t in transfers}

    # --- zero-copy (v1) interface ------------------------------------------------

    def _pages(self, host_indices: Any, n: int) -> list[int]:
        ps = self.geo.page_size
        idx = [int(i) for i in host_indices[: n * ps : ps].tolist()]
        if len(idx) != n or any(i % ps for i in idx):
            raise ValueError("host_indices must hold page-aligned slots, page_size per key")
        return [i // ps for i in idx]

    def batch_get_v1(self, keys_: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        start = time.perf_counter()
        out = self._get_v1(keys_, host_indices)
        self._note(True, sum(out), time.perf_counter() - start)
        return out

    def _get_v1(self, keys_: List[str], host_indices: Any) -> List[bool]:
        pages = self._pages(host_indices, len(keys_))
        if self.staging is None:
            return self._run(keys_, pages, load=True)
        out: List[bool] = []
        for lo in range(0, len(keys_), self.staging.slots):
            ks, ps = keys_[lo : lo + self.staging.slots], pages[lo : lo + self.staging.slots]
            with self.staging.acquire(len(ks)) as slots:
                ok = self._run(ks, slots, load=True)
                for good, slot, page in zip(ok, slots, ps):
                    if good:
                        self.staging.to_host(self.mem_pool_host, slot, page)
            out += ok
        return out

    def batch_set_v1(self, keys_: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
        start = time.perf_counter()
        pages = self._pages(host_indices, len(keys_))
        have = self.batch_exists(keys_)  # pages already stored are not copied again
        out = [True] * have + self._set_v1(keys_[have:], pages[have:])
        self._note(False, sum(out) - have, time.perf_counter() - start)
        return out

    def _set_v1(self, todo_k: List[str], todo_p: List[int]) -> List[bool]:
        if self.staging is None:
            return self._run(todo_k, todo_p, load=False)
        out: List[bool] = []
        for lo in range(0, len(todo_k), self.staging.slots):
            ks, ps = todo_k[lo : lo + self.staging.slots], todo_p[lo : lo + self.staging.slots]
            with self.staging.acquire(len(ks)) as slots:
                for slot, page in zip(slots, ps):
                    self.staging.from_host(self.mem_pool_host, slot, page)
                out += self._run(ks, slots, load=False)
        return out

    def _run(self, keys_: Sequence[str], blocks: Sequence[int], load: bool) -> List[bool]:
        """Loads or saves pages into/from blocks and waits; per-page success."""
        if not keys_:
            return []
        s = self._sess()
        if not s.ready:  # peer down: a miss / not stored, no call
            return [False] * len(keys_)
        refs = [PageRef(self.key(k), (b,)) for k, b in zip(keys_, blocks)]
        try:
            op = (s.load(refs, deadline_ms=self.deadline_ms, wait=True) if load
                  else s.save(refs, deadline_ms=self.deadline_ms, wait=True))
            res: OpResult = op.wait(self.deadline_ms / 1000.0 + 2.0)
        except errors.OrbitKVError as e:
            log.warning("orbitkv %s of %d pages failed: %s", "load" if load else "save", len(refs), e)
            return [False] * len(refs)
        return [res.done and p.ok for p in res.pages] if res.pages else [False] * len(refs)

    # --- legacy interface (copies through staging) -------------------------------

    def _legacy_staging(self) -> Staging:
        with self._lock:
            if self.staging is None:  # zero-copy pools still need a slot for legacy calls
                raise errors.FailedPrecondition("legacy get/set need staging; use interface_v1 with a shared pool")
            return self.staging

    def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any:
        st = self._legacy_staging()
        with st.acquire(1) as slots:
            if not self._run([key], slots, load=True)[0]:
                return None
            flat = hostpool.canonical_to_flat(st.slot_view(slots[0]), self.geo)
        if target_location is not None:
            target_location.view(-1).copy_(flat.view(target_location.dtype) if flat.dtype != target_location.dtype else flat)
            return target_location
        return flat

    def batch_get(self, keys_: List[str], target_locations: Any = None, target_sizes: Any = None) -> List[Any]:
        locs = target_locations or [None] * len(keys_)
        out = []
        for k, loc in zip(keys_, locs):
            v = self.get(k, loc)
            out.append(v)
            if v is None:
                break
        return out + [None] * (len(keys_) - len(out))

    def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool:
        if value is None:
            return False
        st = self._legacy_staging()
        with st.acquire(1) as slots:
            st.slot_view(slots[0]).copy_(hostpool.flat_to_canonical(value.reshape(-1), self.geo))
            return self._run([key], slots, load=False)[0]

    def batch_set(self, keys_: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool:
        return all(self.set(k, v) for k, v in zip(keys_, values or []))

    # --- admin -------------------------------------------------------------------

    def _note(self, load: bool, pages: int, seconds: float) -> None:
        """Records one get (load) or set of ``pages`` pages moved in
        ``seconds`` for get_stats; nothing when SGLang's storage metrics are
        off or nothing moved."""
        if not self._metrics_on or pages <= 0:
            return
        page_bytes = self.session.info.page_bytes if self.session is not None else 0
        gbps = pages * page_bytes / 1e9 / seconds if seconds > 0 and page_bytes else 0.0
        with self._stats_lock:
            if load:
                self._stats.prefetch_pgs.append(pages)
                self._stats.prefetch_bandwidth.append(gbps)
            else:
                self._stats.backup_pgs.append(pages)
                self._stats.backup_bandwidth.append(gbps)

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics since the last call (this pool's and its
        extra pools'), or None with storage metrics off."""
        if not self._metrics_on:
            return None
        out = _compat.StorageMetrics()
        for src in (self, *self._lanes.values()):
            with src._stats_lock:
                got, src._stats = src._stats, _compat.StorageMetrics()
            out.prefetch_pgs += got.prefetch_pgs
            out.backup_pgs += got.backup_pgs
            out.prefetch_bandwidth += got.prefetch_bandwidth
            out.backup_bandwidth += got.backup_bandwidth
        return out

    def clear(self) -> None:
        log.warning("orbitkv: clear() ignored; the fabric is shared with other engines (use `orbitkv` admin Evict)")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        for lane in self._lanes.values():
            lane.close()
        if self.client is not None:
            self.client.close()
        if self.staging is not None:
            self.staging.close()
