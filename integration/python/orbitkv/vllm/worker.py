"""The connector's worker half (runs in every vLLM worker process).

Registers the paged KV tensors with the peer (one session per worker),
starts the loads and saves the scheduler planned, and reports completions:
finished_recving for async loads, finished_sending for finished requests
whose saves are done, and the block ids of pages that failed to load (from
a load's first failed page to its end: _failed_blocks).

Operations are waited on by a small pool of threads (owned here, joined on
shutdown); vLLM's step only reads their results. A load or save that does
not finish by its deadline plus a grace period counts as failed.

Layer-wise loads (config ``layerwise``, a CUDA session whose peer returned
layer events): start_load_kv issues ONE layer-wise Load for all of the
step's loads (the peer's per-layer events are shared by a session's loads,
so two would race), which returns once the copies are enqueued on the
device; wait_for_layer_load(layer) then makes the current CUDA stream wait
on that layer's event (a GPU-side wait: the CPU never blocks), and the
step's end collects the page results through Wait, reporting failed blocks
as for every load. If the Load call itself fails, no event is waited on and
every block of the step's loads is reported failed (the engine recomputes).
A step vLLM runs as one full CUDA graph (decode-only batches) calls no
wait_for_layer_load: start_load_kv then makes the stream wait for every
layer's event before the graph starts.
"""

from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import logging
import threading
import time
from typing import Any, Mapping, Optional, Sequence

from orbitkv import buffers, errors
from orbitkv.client import SKIP_BLOCK, Client, DTYPE_BYTES, Durability, Op, OpResult, PageRef, Session
from orbitkv.keys import Layout
from orbitkv.vllm.config import ConnectorConfig
from orbitkv.vllm.metadata import LoadSpec, OrbitKVMetadata, PageSpan, SaveSpec, SavesDone

log = logging.getLogger(__name__)

_GRACE_S = 2.0


@dataclasses.dataclass
class _LoadState:
    spec: LoadSpec
    future: cf.Future
    layerwise: bool = False  # collected at the step's end (blocking)


def _split(res: OpResult, specs: Sequence[LoadSpec]) -> list[OpResult]:
    """One combined load's result, cut back into the specs' page ranges."""
    out, at = [], 0
    for sp in specs:
        pages = res.pages[at:at + len(sp.blocks)] if res.pages else ()
        out.append(OpResult(res.op_id, res.done, tuple(pages)))
        at += len(sp.blocks)
    return out


def _refs(span: PageSpan, rank: int) -> list[PageRef]:
    ks = span.keys[rank]
    out = [PageRef(k, b) for k, b in zip(ks, span.blocks)]
    skip = getattr(span, "skip_blocks", 0)
    if skip and out:  # blocks the engine computed itself: never overwritten
        out[0] = PageRef(out[0].key, (SKIP_BLOCK,) * skip + tuple(out[0].blocks[skip:]))
    return out


def _open_events(device: Any, handles: Sequence[bytes]) -> list[Any]:
    """The peer's interprocess layer events, opened in this process."""
    import torch

    return [torch.cuda.Event.from_ipc_handle(device, h) for h in handles]


def _stream_wait(device: Any, event: Any) -> None:
    """Later work on the current stream waits for event (no CPU wait)."""
    import torch

    torch.cuda.current_stream(device).wait_event(event)


def _record_event(device: Any) -> Any:
    """An event recorded on the current stream now (synchronize() waits for it)."""
    import torch

    ev = torch.cuda.Event(blocking=True)  # synchronize() sleeps instead of spinning a core
    ev.record(torch.cuda.current_stream(device))
    return ev


def _log_failed_pages(req_id: str, res: OpResult) -> None:
    """Says why pages of a load failed (the engine recomputes them)."""
    bad = res.failed_indices()
    if not bad:
        return
    first = res.pages[bad[0]] if res.pages else None
    why = f"{first.code.name}: {first.message}" if first is not None else "not done by its deadline"
    log.warning("orbitkv load for %s: %d of %d pages failed, recomputing them (first: %s)", req_id, len(bad),
                len(res.pages), why)


def _failed_blocks(spec: LoadSpec, res: OpResult) -> set[int]:
    """The blocks a load reports failed: those of its first page that did not
    load (a result without pages: every page failed) and of every page after
    it, never the skipped (locally computed) ones. vLLM keeps the pages before
    them and computes from there; reporting the later pages too says the same
    to a scheduler that does not truncate at the first failed block."""
    n = len(spec.blocks)
    first = next((i for i in range(n) if i >= len(res.pages) or not res.pages[i].ok), n)
    return {b for i in range(first, n) for b in spec.loaded_blocks(i)}


def _result_of(f: cf.Future) -> OpResult:
    try:
        return f.result()
    except Exception as e:  # _wait raised (peer lost): every page failed
        log.warning("orbitkv layer-wise load failed, recomputing: %s", e)
        return OpResult("", True, ())


class WorkerHalf:
    def __init__(self, cfg: ConnectorConfig, tp_rank: int) -> None:
        self.cfg = cfg
        self.rank = tp_rank
        self.layout: Layout = cfg.layout.with_rank(tp_rank)
        self.client: Optional[Client] = None
        self.session: Optional[Session] = None
        # Loads are latency-critical: they never queue behind saves.
        self._load_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="orbitkv-load")
        self._save_pool = cf.ThreadPoolExecutor(max_workers=4, thread_name_prefix="orbitkv-save")
        self._lock = threading.Lock()
        self._loads: dict[str, _LoadState] = {}
        self._saves: dict[str, list[cf.Future]] = {}
        self._finishing: set[str] = set()
        self._released: set[str] = set()  # early_free: finished, blocks freed, saves reported in SavesDone
        self._saves_done: dict[str, int] = {}  # released requests whose saves ended, for the step's SavesDone
        self.flush_waits = 0  # steps that waited for saves of blocks they reuse (orbitkv.vllm.fences)
        self._load_errors: set[int] = set()
        self._closed = False
        self._layer_index: dict[str, int] = {}
        self._events: list[Any] = []  # torch.cuda.Event per layer, opened from the peer's handles
        self._events_gen = -1  # session generation the events belong to
        self._events_sid = ""  # and that session's id
        self._device: Any = None
        self._wait_layers = False  # this step's layer-wise load was enqueued
        # Instrumentation (cheap, CPU only): per layer-wise load, the Load call's latency
        # (it answers once enqueued) and the step end's wait for the page results.
        self.lw_timings: list[dict] = []
        self.skipped_saves = 0  # save specs not started because the peer was unreachable
        self._shared_files: list[buffers.SharedFile] = []  # /dev/shm copies of CPU KV caches (share_cpu_tensors)

    # --- registration ----------------------------------------------------------

    def register_kv_caches(self, kv_caches: Mapping[str, Any]) -> None:
        self._layer_index = {name: i for i, name in enumerate(kv_caches)}
        self._share_cpu_caches(kv_caches)
        want = self.layout.byte_layout
        kv = buffers.vllm_kv(kv_caches, self.cfg.kv_layout, head_dim=self.layout.head_dim, prefer=want)
        if kv.byte_layout != want:
            t = next(iter(kv_caches.values()))
            raise errors.BufferError_(
                f"vLLM's KV tensors (shape {tuple(t.shape)}, strides {t.stride()}) hold {kv.byte_layout} pages, but "
                f"pages are keyed as {want}: set kv_connector_extra_config byte_layout (or VLLM_KV_CACHE_LAYOUT) so they agree")
        self.register_planes(kv.planes)

    def _share_cpu_caches(self, kv_caches: Mapping[str, Any]) -> None:
        """vLLM's CPU backend keeps its KV cache in anonymous memory, which the
        peer cannot map: move it into /dev/shm in place (before the first
        forward), once; files of killed engines before it are swept."""
        made = buffers.share_cpu_tensors(list(kv_caches.values()))
        if made:
            self._shared_files += made
            size = sum(f.size_bytes for f in made)
            log.info("orbitkv: moved vLLM's CPU KV cache (%d buffers, %.1f GiB) into /dev/shm so the peer can map it",
                     len(made), size / 2**30)

    def register_planes(self, planes: Sequence[Sequence[Any]]) -> None:
        """Registers per-layer (K, V) block-major planes (any engine)."""
        desc = buffers.describe_planes(planes)
        self._check(desc)
        # Lazy: with the peer down the session opens later (by itself);
        # until then loads fail (recompute) and saves are skipped.
        self.client = Client(self.cfg.socket, timeout=self.cfg.timeout_s, connect_timeout=self.cfg.connect_timeout_s,
                             lazy=True)
        self.session = self.client.open_session(
            self.layout,
            block_tokens=self.cfg.block_tokens,
            num_blocks=desc.num_blocks,
            buffers=desc.buffers,
            segments=desc.segments,
            engine_id=f"{self.cfg.engine_id}-tp{self.rank}",
            lazy=True,
        )
        dev = getattr(planes[0][0], "device", None) if planes else None
        self._device = dev if getattr(dev, "type", "") == "cuda" else None
        self._refresh_events()
        if not self.session.id:
            log.warning("orbitkv: peer %s not reachable; %d blocks will be registered once it is "
                        "(requests recompute until then)", self.cfg.socket, desc.num_blocks)
            return
        log.info("orbitkv session %s: %d blocks, page %d bytes, %d layer events%s", self.session.id, desc.num_blocks,
                 self.session.info.page_bytes, len(self.session.info.layer_events),
                 " (layer-wise loads on)" if self._events else "")

    def _refresh_events(self) -> None:
        """Opens the session's layer events (again after a reopen)."""
        s = self.session
        if s is None or s.generation == self._events_gen:
            return
        info = s.info  # one SessionInfo: its id and its events belong together
        self._events_gen, self._events, self._events_sid = s.generation, [], info.session_id
        if not (self.cfg.layerwise and self._device is not None and info.layer_events):
            return
        try:
            self._events = _open_events(self._device, info.layer_events)
        except Exception as e:  # an old torch or driver: whole-request loads
            log.warning("orbitkv: cannot open the peer's layer events (%s); layer-wise loads off", e)
            self._events = []

    @property
    def layerwise(self) -> bool:
        """Whether this worker's loads are layer-wise."""
        return bool(self._events)

    def _check(self, desc: buffers.KVDescription) -> None:
        lay = self.layout
        want_block = self.cfg.block_tokens * lay.kv_heads * lay.head_dim * DTYPE_BYTES.get(lay.dtype, 0)
        problems = []
        if len(desc.segments) != 2 * lay.num_layers:
            problems.append(f"{len(desc.segments) // 2} layers, layout says {lay.num_layers}")
        if desc.dtype != lay.dtype:
            problems.append(f"dtype {desc.dtype}, layout says {lay.dtype}")
        if any(s.block_bytes != want_block for s in desc.segments):
            problems.append(f"block bytes {desc.segments[0].block_bytes}, layout implies {want_block}")
        if problems:
            raise errors.BufferError_("KV tensors do not match the declared layout: " + "; ".join(problems))

    # --- per step ----------------------------------------------------------------

    def start_load_kv(self, meta: OrbitKVMetadata, hooks_skipped: bool = False) -> None:
        """Starts the step's loads. hooks_skipped: the step's attention layers
        will call no wait_for_layer_load (one full CUDA graph), so a layer-wise
        load makes the stream wait for every layer here instead."""
        self._wait_layers = False
        self._refresh_events()
        # vLLM fences freed blocks itself for consumer roles (_compat.engine_fences_loads); a
        # producer's restores wait for the engine's earlier kernels here (_engine_event)
        ready = self._engine_event() if meta.loads and not self.cfg.engine_fences_loads else None
        if self._events and meta.loads:
            self._start_layerwise(meta.loads, ready)
            if hooks_skipped and self._wait_layers:
                for ev in self._events:
                    _stream_wait(self._device, ev)
                self._wait_layers = False
            return
        specs = list(meta.loads)
        # The step waits for its sync loads anyway: the last one runs on this
        # thread (no wake-up of an idle pool thread on its critical path).
        inline = specs.pop() if specs and specs[-1].sync else None
        for spec in specs:
            fut = self._load_pool.submit(self._run_load, spec, ready)
            with self._lock:
                self._loads[spec.req_id] = _LoadState(spec, fut)
        if inline is not None:
            self._run_inline(inline, ready)
        for spec in meta.loads:
            if spec.sync:
                self._loads[spec.req_id].future.result()

    def _run_inline(self, spec: LoadSpec, ready: Any) -> None:
        """_run_load on the caller's thread, its outcome in a done future as a
        pool thread would leave it (get_results reads it the same way)."""
        fut: cf.Future = cf.Future()
        with self._lock:
            self._loads[spec.req_id] = _LoadState(spec, fut)
        try:
            fut.set_result(self._run_load(spec, ready))
        except Exception as e:  # as a pool thread's future holds it: raised by the wait below
            fut.set_exception(e)

    def _start_layerwise(self, specs: Sequence[LoadSpec], ready: Any = None) -> None:
        """One layer-wise Load for every load of the step; returns once the
        peer has enqueued it (the events are then safe to wait on). It waits
        on the CPU for the engine's earlier kernels first (ready: the peer's
        copies must not overtake them, _engine_event), which idles the GPU for
        the Load call in steps that restore."""
        assert self.session is not None
        refs = [r for sp in specs for r in _refs(sp, self.rank)]
        leases = {sp.leases.get(self.rank, "") for sp in specs}
        lease = leases.pop() if len(leases) == 1 else ""
        op: Optional[Op] = None
        t_wait = t0 = time.perf_counter()
        if self.session.ready:  # peer down: no call; every block fails (recompute)
            if ready is not None:
                ready.synchronize()
                t0 = time.perf_counter()
            try:
                op = self.session.load(refs, lease_id=lease, deadline_ms=self.cfg.load_deadline_ms, layerwise=True,
                                       end_lease=True)
            except errors.OrbitKVError as e:
                if lease:
                    try:
                        op = self.session.load(refs, deadline_ms=self.cfg.load_deadline_ms, layerwise=True)
                    except errors.OrbitKVError as e2:
                        e = e2
                if op is None:
                    log.warning("orbitkv layer-wise load of %d pages failed, recomputing: %s", len(refs), e)
        if op is not None:
            self._refresh_events()  # the Load reopened the session: its events are new ones
        # the events waited on must be those of the session that runs the Load
        self._wait_layers = op is not None and bool(self._events) and op.session_id == self._events_sid
        self.lw_timings.append({"pages": len(refs), "engine_wait_s": t0 - t_wait, "load_rpc_s": time.perf_counter() - t0})
        del self.lw_timings[:-256]
        whole = cf.Future() if op is None else self._load_pool.submit(self._wait, op, self.cfg.load_deadline_ms)
        if op is None:
            whole.set_result(OpResult("", True, ()))
        with self._lock:
            for i, sp in enumerate(specs):
                fut: cf.Future = cf.Future()
                whole.add_done_callback(lambda w, i=i, f=fut: f.set_result(_split(_result_of(w), specs)[i]))
                self._loads[sp.req_id] = _LoadState(sp, fut, layerwise=True)
        if op is not None and not self._wait_layers:
            whole.result()  # no layer events to wait on after all: the whole load, before the forward

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Layer-wise loads: the current CUDA stream waits for the layer's
        event (GPU-side; returns at once on the CPU)."""
        if not self._wait_layers:
            return
        i = self._layer_index.get(layer_name)
        if i is None or i >= len(self._events):
            return
        _stream_wait(self._device, self._events[i])

    def wait_for_save(self, meta: OrbitKVMetadata) -> None:
        """Starts the planned saves. It does not block: saved pages are whole
        prompt pages (a handoff's tail: prompt slots of its last blocks),
        which vLLM never rewrites while the request lives, and
        the blocks of a finished request stay allocated until its saves are
        reported (delayed free); preemption flushes them first."""
        if not meta.saves:
            return
        if self.session is None or not self.session.ready:
            # Peer down (or session not open): the saves are skipped, reported
            # done (not saved) at once, so a delayed free never waits on them.
            for spec in meta.saves:
                fut: cf.Future = cf.Future()
                fut.set_result(OpResult("", True, ()))
                with self._lock:
                    self._saves.setdefault(spec.req_id, []).append(fut)
            self.skipped_saves += len(meta.saves)
            return
        ready = self._engine_event()
        for spec in meta.saves:
            fut = self._save_pool.submit(self._run_save, spec, ready)
            with self._lock:
                self._saves.setdefault(spec.req_id, []).append(fut)

    def begin_step(self, meta: OrbitKVMetadata) -> None:
        """Before the step writes any block: records the requests released
        with saves in flight and waits for the saves that read blocks this step
        reuses (meta.flush). Each save ends by its own deadline (_run_save); a
        flush that outlasts them all is logged and the step goes on."""
        with self._lock:
            self._released.update(meta.released)
            futs = [f for r in meta.flush for f in self._saves.get(r, ())]
        if not futs or all(f.done() for f in futs):
            return
        self.flush_waits += 1
        limit = len(futs) * (self.cfg.save_deadline_ms / 1000.0 + _GRACE_S)
        _, pending = cf.wait(futs, timeout=limit)
        # Saves still queued behind others never start (a save that reads the
        # block after the step wrote it would store wrong bytes); running ones
        # end by their own deadline (_run_save), and are waited for.
        running = [f for f in pending if not f.cancel()]
        if pending:
            log.warning("orbitkv: %d saves of reused blocks still queued after %.0f s: cancelled; %d running",
                        len(pending) - len(running), limit, len(running))
        cf.wait(running)

    def take_saves_done(self) -> Optional[SavesDone]:
        """The step's SavesDone (vLLM's worker metadata), None when empty."""
        with self._lock:
            done, self._saves_done = self._saves_done, {}
        return SavesDone(done) if done else None

    def handle_preemptions(self, req_ids: Sequence[str]) -> None:
        with self._lock:
            futs = [f for r in req_ids for f in self._saves.get(str(r), ())]
        cf.wait(futs)

    def get_results(self, finished_req_ids: Sequence[str]) -> tuple[set[str], set[str], set[str]]:
        """(finished_sending, finished_recving, failed_recving)."""
        sending, recving, failed = set(), set(), set()
        with self._lock:
            for r in finished_req_ids:
                if str(r) in self._saves:
                    self._finishing.add(str(r))
                elif str(r) in self._released:  # nothing of it in flight here
                    self._report_done(str(r), sending)
            for r in list(self._finishing):
                if all(f.done() for f in self._saves[r]):
                    self._report_done(r, sending)
                    self._finishing.discard(r)
                    del self._saves[r]
            layerwise = [st for st in self._loads.values() if st.layerwise]
        t0 = time.perf_counter()
        for st in layerwise:  # the step's forward waited on the copies already
            st.future.result()
        if layerwise and self.lw_timings:
            self.lw_timings[-1].setdefault("results_wait_s", time.perf_counter() - t0)
        with self._lock:
            for r, st in list(self._loads.items()):
                if not st.future.done():
                    continue
                del self._loads[r]
                bad = _failed_blocks(st.spec, st.future.result())
                self._load_errors.update(bad)
                if bad:
                    failed.add(r)
                if not st.spec.sync:
                    recving.add(r)
        return sending, recving, failed

    def _report_done(self, r: str, sending: set[str]) -> None:
        """A finished request's saves ended: finished_sending frees its blocks
        (a delayed free); a released one's blocks are free already, so it goes
        to SavesDone instead (vLLM asserts a request in finished_sending exists)."""
        if r in self._released:
            self._released.discard(r)
            self._saves_done[r] = 1
        else:
            sending.add(r)

    def get_block_ids_with_load_errors(self) -> set[int]:
        with self._lock:
            out, self._load_errors = self._load_errors, set()
        return out

    # --- operations (pool threads) ---------------------------------------------------

    def _run_load(self, spec: LoadSpec, ready: Any = None) -> OpResult:
        assert self.session is not None, "register_kv_caches was not called"
        refs = _refs(spec, self.rank)
        lease = spec.leases.get(self.rank, "")
        if not self.session.ready:  # peer down: every block fails (recompute), no call
            log.debug("orbitkv load for %s skipped: peer unreachable", spec.req_id)
            return OpResult("", True, ())
        if ready is not None:
            ready.synchronize()  # on the load thread: the engine's earlier kernels are done (_engine_event)
        try:
            try:
                # The lease ends with the load: its budget is free for the next restore at once.
                op = self.session.load(refs, lease_id=lease, deadline_ms=self.cfg.load_deadline_ms, wait=True,
                                       end_lease=True)
            except (errors.NotFound, errors.InvalidRequest, errors.FailedPrecondition) as e:
                if not lease:
                    raise
                log.info("load with lease %s refused (%s); retrying without it", lease, e)
                op = self.session.load(refs, deadline_ms=self.cfg.load_deadline_ms, wait=True)
            res = self._wait(op, self.cfg.load_deadline_ms)
            _log_failed_pages(spec.req_id, res)
            return res
        except errors.OrbitKVError as e:
            log.warning("orbitkv load for %s failed, recomputing: %s", spec.req_id, e)
            return OpResult("", True, ())

    def _engine_event(self) -> Any:
        """On a GPU, an event recorded on the engine's stream now, after all the
        work the engine has launched. The peer's device copies run on its own
        stream, in its own process, unordered with the engine's kernels, so
        neither a save nor a load may start before them: a save reads blocks
        the step just wrote; a load writes blocks that, with overlapping
        batches (vLLM's async scheduling), a step still on the GPU may be
        writing — those of a request that stopped or was aborted after it was
        scheduled into that step — unless vLLM defers such frees itself, as
        0.26 does for consumer roles (_compat.engine_fences_loads: the load
        then skips this wait; a kv_producer's restores keep it)."""
        if self._device is None:
            return None
        return _record_event(self._device)

    def _run_save(self, spec: SaveSpec, ready: Any = None) -> OpResult:
        assert self.session is not None, "register_kv_caches was not called"
        dur = Durability.SSD if self.cfg.durability == "ssd" else Durability.DRAM
        if ready is not None:
            ready.synchronize()  # on the save thread: the step does not block
        try:
            op = self.session.save(_refs(spec, self.rank), durability=dur, deadline_ms=self.cfg.save_deadline_ms,
                                   wait=True)
            res = self._wait(op, self.cfg.save_deadline_ms)
            if not res.ok:
                log.info("orbitkv save for %s: %d of %d pages not saved", spec.req_id, len(res.failed_indices()), len(spec))
            return res
        except errors.OrbitKVError as e:
            log.warning("orbitkv save for %s failed: %s", spec.req_id, e)
            return OpResult("", True, ())

    def _wait(self, op: Op, deadline_ms: int) -> OpResult:
        res = op.wait(deadline_ms / 1000.0 + _GRACE_S)
        if not res.done:
            log.warning("orbitkv %s %s not done after its deadline; treating as failed", op.kind, op.op_id)
        return res

    def shutdown(self) -> None:
        self._events = []
        if self._closed:
            return
        self._closed = True
        self._load_pool.shutdown(wait=True)
        self._save_pool.shutdown(wait=True)
        if self.client is not None:
            self.client.close()
        for f in self._shared_files:
            f.close()
        self._shared_files = []
