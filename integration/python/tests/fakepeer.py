"""An in-process stand-in for the Go peer's EngineService (tests only).

It maps the engine's shared-memory buffers and gathers/scatters page blobs
exactly as the Segment contract says, so the adapters' data path is checked
end to end without the Go binary. Like the real peer it accepts lookup-only
sessions (no buffers, no segments, num_blocks 0; page size from the layout's
dtype) and refuses their Save and Load with FAILED_PRECONDITION. Fault
injection: ``corrupt`` (keys whose loads report PAGE_CORRUPT), ``tiers`` (keys a
Lookup counts on SSD or on another peer), ``delay_s``,
``restart()`` (forget sessions, leases and operations, as a restarted peer
does; the store stands for the SSD tier and survives).
"""

from __future__ import annotations

import mmap
import os
import threading
import time
import uuid
from concurrent import futures

import grpc

from orbitkv._proto import engine_pb2 as pb
from orbitkv._proto import engine_pb2_grpc as pbg
from orbitkv.client import SKIP_BLOCK as SKIP

# element sizes the real peer knows for a lookup-only session's dtype
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "float16": 2, "bfloat16": 2, "fp32": 4, "float32": 4,
               "fp8_e4m3": 1, "fp8_e5m2": 1, "fp8": 1}


class _Sess:
    def __init__(self, req):
        self.req = req
        self.maps = []
        for b in req.buffers:
            fd = os.open(b.shm.path, os.O_RDWR)
            try:
                self.maps.append(mmap.mmap(fd, b.size_bytes))
            finally:
                os.close(fd)
        self.segs = sorted(req.segments, key=lambda s: (s.layer, s.plane))
        self.bpp = req.layout.page_tokens // req.block_tokens

    def close(self):
        for m in self.maps:
            m.close()


class _Op:
    def __init__(self, n):
        self.pages = [pb.PageResult(code=pb.PAGE_PENDING) for _ in range(n)]
        self.done = threading.Event()


class FakePeer(pbg.EngineServiceServicer):
    def __init__(self, socket_path: str, *, delay_s: float = 0.0):
        self.socket = socket_path
        self.delay_s = delay_s
        self.store: dict[bytes, bytes] = {}
        self.corrupt: set[bytes] = set()
        # Where a Lookup says a page is ("ssd" or "remote"; else DRAM), in its tier counts.
        self.tiers: dict[bytes, str] = {}
        self.sessions: dict[str, _Sess] = {}
        self.leases: dict[str, tuple[str, list[bytes]]] = {}
        self.ops: dict[str, _Op] = {}
        self.calls: dict[str, int] = {}
        self.layer_events = False  # give non-lookup sessions one fake event handle per layer
        self.layerwise_loads: list[int] = []  # pages of each layer-wise Load
        self.lock = threading.Lock()
        self._io = futures.ThreadPoolExecutor(4)
        self.server = grpc.server(futures.ThreadPoolExecutor(16))
        pbg.add_EngineServiceServicer_to_server(self, self.server)
        self.server.add_insecure_port("unix:" + socket_path)
        self.server.start()

    def stop(self):
        self.server.stop(0).wait()
        self._io.shutdown(wait=True)
        for s in self.sessions.values():
            s.close()

    def restart(self):
        """Forgets every session, lease and operation (a peer restart)."""
        with self.lock:
            sessions, self.sessions = self.sessions, {}
            self.leases.clear()
            self.ops.clear()
        for s in sessions.values():
            s.close()

    def _count(self, name):
        with self.lock:
            self.calls[name] = self.calls.get(name, 0) + 1

    def _sess(self, sid, ctx) -> _Sess:
        s = self.sessions.get(sid)
        if s is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, f"session {sid!r} unknown")
        return s

    # --- RPCs -----------------------------------------------------------------

    def OpenSession(self, req, ctx):
        self._count("OpenSession")
        lay = req.layout
        if req.block_tokens == 0 or lay.page_tokens % req.block_tokens:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "block_tokens must divide page_tokens")
        lookup_only = req.num_blocks == 0 and not req.buffers and not req.segments
        if lookup_only and lay.dtype not in DTYPE_BYTES:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, f"lookup-only session: unknown dtype {lay.dtype!r}")
        if not lookup_only and len(req.segments) != 2 * lay.num_layers:
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "need num_layers*2 segments")
        for s in req.segments:
            size = req.buffers[s.buffer].size_bytes
            if s.offset + (req.num_blocks - 1) * s.block_stride + s.block_bytes > size:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, f"segment {s.layer}/{s.plane} exceeds its buffer")
        sid = uuid.uuid4().hex
        sess = _Sess(req)
        self.sessions[sid] = sess
        page_bytes = sum(s.block_bytes for s in req.segments) * sess.bpp
        if lookup_only:
            page_bytes = lay.num_layers * 2 * lay.page_tokens * lay.kv_heads * lay.head_dim * DTYPE_BYTES[lay.dtype]
        from orbitkv import keys

        fp = keys.Layout(**{f: getattr(lay, f) for f in keys.Layout.__dataclass_fields__}).fingerprint()
        # byte 0: the layer + 1; byte 1: how many sessions this peer opened before (a reopened
        # session's events are new ones)
        nth = self.calls.get("OpenSession", 1) - 1
        events = [bytes([i + 1, nth % 256]) * 32 for i in range(lay.num_layers)] if self.layer_events and not lookup_only else []
        sess.layer_events = bool(events)
        return pb.OpenSessionResponse(session_id=sid, layout_fingerprint=fp, page_bytes=page_bytes,
                                      keepalive_ms=req.keepalive_ms or 1000, layer_events=events)

    def Keepalive(self, req, ctx):
        self._count("Keepalive")
        self._sess(req.session_id, ctx)
        return pb.KeepaliveResponse()

    def CloseSession(self, req, ctx):
        self._count("CloseSession")
        s = self.sessions.pop(req.session_id, None)
        if s is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown session")
        with self.lock:
            for lid in [l for l, (sid, _) in self.leases.items() if sid == req.session_id]:
                del self.leases[lid]
        s.close()
        return pb.CloseSessionResponse()

    def Lookup(self, req, ctx):
        self._count("Lookup")
        self._sess(req.session_id, ctx)
        hit = 0
        for k in req.keys:
            if len(k) != 16:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "key must be 16 bytes")
            if k not in self.store:
                break
            hit += 1
        if req.lease_from > len(req.keys):
            ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "lease_from is past the keys")
        held = min(req.lease_from, hit)  # the engine's own pages: counted in the hit, not leased
        where = [self.tiers.get(bytes(k), "dram") for k in req.keys[held:hit]]
        counts = pb.TierCounts(dram=where.count("dram"), ssd=where.count("ssd"), remote=where.count("remote"))
        resp = pb.LookupResponse(hit_pages=hit, tiers=counts)
        if req.lease and hit > held:
            lid = uuid.uuid4().hex
            with self.lock:
                self.leases[lid] = (req.session_id, list(req.keys[held:hit]))
            resp.lease_id = lid
            resp.lease_expires_unix_ms = int(time.time() * 1000) + (req.lease_ms or 30000)
        return resp

    def Release(self, req, ctx):
        self._count("Release")
        with self.lock:
            if self.leases.pop(req.lease_id, None) is None:
                ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown lease")
        return pb.ReleaseResponse()

    def _check_pages(self, s: _Sess, pages, ctx, load: bool = False):
        if not s.req.buffers:
            ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "session registered no kv buffers (lookup-only)")
        for p in pages:
            if len(p.key) != 16 or len(p.blocks) != s.bpp:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "bad page ref")
            if SKIP in p.blocks and not load:
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "a save cannot skip blocks")
            if all(b == SKIP for b in p.blocks):
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "page skips all its blocks")
            if any(b >= s.req.num_blocks and b != SKIP for b in p.blocks):
                ctx.abort(grpc.StatusCode.INVALID_ARGUMENT, "block out of range")

    def _start(self, fn, s, pages):
        oid = uuid.uuid4().hex
        op = _Op(len(pages))
        self.ops[oid] = op

        def run():
            if self.delay_s:
                time.sleep(self.delay_s)
            for i, p in enumerate(pages):
                op.pages[i] = fn(s, p)
            op.done.set()

        self._io.submit(run)
        return pb.OpHandle(op_id=oid)

    def _save_one(self, s: _Sess, p):
        parts = []
        for seg in s.segs:
            m = s.maps[seg.buffer]
            for b in p.blocks:
                o = seg.offset + b * seg.block_stride
                parts.append(m[o : o + seg.block_bytes])
        self.store[bytes(p.key)] = b"".join(parts)
        return pb.PageResult(code=pb.PAGE_OK, tier=pb.TIER_DRAM)

    def _load_one(self, s: _Sess, p):
        blob = self.store.get(bytes(p.key))
        if blob is None:
            return pb.PageResult(code=pb.PAGE_NOT_FOUND, message="not found")
        if bytes(p.key) in self.corrupt:
            return pb.PageResult(code=pb.PAGE_CORRUPT, message="checksum mismatch")
        pos = 0
        for seg in s.segs:
            m = s.maps[seg.buffer]
            for b in p.blocks:
                if b != SKIP:  # skip: the engine holds this block; its blob bytes are passed over
                    o = seg.offset + b * seg.block_stride
                    m[o : o + seg.block_bytes] = blob[pos : pos + seg.block_bytes]
                pos += seg.block_bytes
        return pb.PageResult(code=pb.PAGE_OK, tier=pb.TIER_DRAM)

    def Save(self, req, ctx):
        self._count("Save")
        s = self._sess(req.session_id, ctx)
        self._check_pages(s, req.pages, ctx)
        return self._start(self._save_one, s, list(req.pages))

    def Load(self, req, ctx):
        self._count("Load")
        s = self._sess(req.session_id, ctx)
        self._check_pages(s, req.pages, ctx, load=True)
        if req.lease_id and req.lease_id not in self.leases:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown lease")
        if req.layerwise:
            if not getattr(s, "layer_events", False):
                ctx.abort(grpc.StatusCode.FAILED_PRECONDITION, "session has no layer events")
            with self.lock:
                self.layerwise_loads.append(len(req.pages))
        return self._start(self._load_one, s, list(req.pages))

    def Wait(self, req, ctx):
        self._count("Wait")
        self._sess(req.session_id, ctx)
        op = self.ops.get(req.op_id)
        if op is None:
            ctx.abort(grpc.StatusCode.NOT_FOUND, "unknown op")
        op.done.wait(req.timeout_ms / 1000.0)
        return pb.OpStatus(op_id=req.op_id, done=op.done.is_set(), pages=list(op.pages))
