"""Describe an engine's KV tensors as peer Buffers and Segments.

CPU engines keep their KV pool in a shared file mapping (the reference engine
uses ``torch.from_file('/dev/shm/…', shared=True, …)``). The backing file and
offset of any view of it are recovered from the tensor's data pointer through
/proc/self/maps, so no registry of allocations is needed.

Every layout reduces to a list, per layer, of two "plane" tensors (K, V)
whose first dimension is the engine block and whose remaining dimensions are
one dense block; block b of a plane occupies
[offset + b*block_stride, + block_bytes) of its buffer (the Segment).

CUDA tensors are described by CUDA IPC handle (``CudaIpcBuffer``): the
handle of the cudaMalloc block behind the tensor's storage
(``untyped_storage()._share_cuda_()``, the same call torch.multiprocessing
uses), the storage's byte offset inside that block and its size; a
segment's offset is the tensor's data pointer minus the storage's. The peer
opens each handle once (cuIpcOpenMemHandle) and copies pages in and out of
the blocks directly. The engine must keep the tensors alive while its session
is open, and must make the KV writes of a step visible (synchronize its
stream) before it asks the peer to save those blocks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import tempfile
from typing import Any, Mapping, Optional, Sequence, Union

from orbitkv.errors import BufferError_, NotFileBacked

DTYPE_NAMES = {
    "torch.float32": "fp32",
    "torch.float16": "fp16",
    "torch.bfloat16": "bf16",
    "torch.float8_e4m3fn": "fp8_e4m3",
    "torch.float8_e5m2": "fp8_e5m2",
    "torch.uint8": "u8",
}


@dataclasses.dataclass(frozen=True)
class ShmBuffer:
    """A shared-memory file the peer maps."""

    path: str
    size_bytes: int

    def to_proto(self) -> Any:
        from orbitkv._proto import engine_pb2

        return engine_pb2.Buffer(shm=engine_pb2.SharedMemory(path=self.path), size_bytes=self.size_bytes)


@dataclasses.dataclass(frozen=True)
class CudaIpcBuffer:
    """A GPU buffer: ``size_bytes`` at ``offset`` inside the cudaMalloc block
    whose 64-byte CUDA IPC handle is ``handle``, on CUDA device ``device``."""

    handle: bytes
    device: int
    offset: int
    size_bytes: int

    def to_proto(self) -> Any:
        from orbitkv._proto import engine_pb2

        ipc = engine_pb2.CudaIpc(handle=self.handle, device=self.device, offset=self.offset)
        return engine_pb2.Buffer(cuda=ipc, size_bytes=self.size_bytes)


Buffer = Union[ShmBuffer, CudaIpcBuffer]


@dataclasses.dataclass(frozen=True)
class Segment:
    layer: int
    plane: int  # 0 = K, 1 = V
    buffer: int
    offset: int
    block_stride: int
    block_bytes: int

    def to_proto(self) -> Any:
        from orbitkv._proto import engine_pb2

        return engine_pb2.Segment(**dataclasses.asdict(self))


@dataclasses.dataclass(frozen=True)
class KVDescription:
    """Everything OpenSession needs to know about the engine's KV memory."""

    buffers: tuple[Buffer, ...]
    segments: tuple[Segment, ...]
    num_blocks: int
    dtype: str  # OrbitKV dtype name ("bf16", …)
    inner_order: str  # e.g. "nhd" / "hnd": block dims, outermost first

    @property
    def page_bytes_per_block(self) -> int:
        return sum(s.block_bytes for s in self.segments)


# --- /proc/self/maps -------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Mapping:
    start: int
    end: int
    shared: bool
    offset: int
    path: str
    inode: int = 0


def _read_maps(pid: str = "self") -> list[_Mapping]:
    out: list[_Mapping] = []
    with open(f"/proc/{pid}/maps") as f:
        for line in f:
            parts = line.rstrip("\n").split(maxsplit=5)
            if len(parts) < 6 or not parts[5].startswith("/"):
                continue
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            out.append(_Mapping(lo, hi, parts[1][3] == "s", int(parts[2], 16), parts[5], int(parts[4])))
    return out


def _memfd_path(m: _Mapping) -> Optional[str]:
    """/proc/PID/fd/N of the open memfd a mapping shows as "/memfd:NAME (deleted)"
    (SGLang's "allocator":"shm" host pool): the peer opens the memfd through that link,
    as long as this process keeps the descriptor open. None when no descriptor is."""
    if not m.path.startswith("/memfd:"):
        return None
    fd_dir = "/proc/self/fd"
    for name in os.listdir(fd_dir):
        link = os.path.join(fd_dir, name)
        try:
            if os.readlink(link) == m.path and os.stat(link).st_ino == m.inode:
                return f"/proc/{os.getpid()}/fd/{name}"
        except OSError:
            continue
    return None


def resolve_file_range(addr: int, length: int, maps: Optional[list[_Mapping]] = None) -> tuple[str, int]:
    """Returns (file path, file offset) of the shared file mapping holding
    [addr, addr+length). Raises NotFileBacked when there is none."""
    for m in maps if maps is not None else _read_maps():
        if m.start <= addr < m.end:
            if addr + length > m.end:
                raise NotFileBacked(f"range {addr:#x}+{length} crosses the end of mapping {m.path}")
            if m.path.endswith(" (deleted)"):
                via = _memfd_path(m)
                if via is None:
                    raise NotFileBacked(f"{m.path}: backing file was unlinked; the peer cannot open it")
                if not m.shared:
                    raise NotFileBacked(f"{m.path} is mapped private")
                return via, m.offset + (addr - m.start)
            if not m.shared:
                raise NotFileBacked(f"{m.path} is mapped private; map it shared (torch.from_file(shared=True))")
            return m.path, m.offset + (addr - m.start)
    raise NotFileBacked(f"address {addr:#x} is not in a file mapping (anonymous or pinned memory)")


# --- CPU engines: KV in anonymous memory --------------------------------------


SHARED_DIR = "/dev/shm"

# An engine's shared KV file older than this whose owner holds no lock on it
# is an orphan (its engine was killed); younger ones may be still being made
# (between mkstemp and flock). Only the lock tells a living engine's file:
# mtime says nothing of liveness (writes through a mapping need not touch it).
ORPHAN_AGE_S = 60.0

# The names of locked shared KV files. Connectors before the locks named
# theirs "orbitkv-kv-…" and held no lock: a sweep must not take a living
# one of those for an orphan, so the locked files have a prefix of their own.
KV_PREFIX = "orbitkv-kvl-"


@dataclasses.dataclass(frozen=True)
class SharedFile:
    """A /dev/shm file holding KV memory moved out of anonymous memory
    (share_cpu_tensors), opened by the peer by its path (a file, not a memfd
    behind /proc/PID/fd: a peer in another PID namespace, a pod with
    hostIPC, opens it too). ``fd`` stays open with a shared flock on the
    file while the engine lives: a killed engine's lock goes with it, and
    the next engine to share its KV removes the orphan (sweep_orphans)."""

    fd: int
    path: str
    size_bytes: int

    def close(self) -> None:
        """The engine's session ended: remove the file (the mappings stay)."""
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        with contextlib.suppress(OSError):
            os.close(self.fd)


def shared_dir() -> str:
    """Where shared KV files go: /dev/shm, else the temporary directory."""
    return SHARED_DIR if os.path.isdir(SHARED_DIR) else tempfile.gettempdir()


def sweep_orphans(prefix: str = KV_PREFIX, directory: Optional[str] = None, age_s: float = ORPHAN_AGE_S) -> list[str]:
    """Removes the shared KV files of engines that died without removing
    them (killed, crashed): files named ``prefix``… older than ``age_s`` on
    which no process holds the lock a living engine keeps. Returns the
    paths removed. The peer may still map one (until its session ends);
    the memory is freed once nothing does."""
    import fcntl
    import time

    removed: list[str] = []
    directory = directory or shared_dir()
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        return removed
    now = time.time()
    for n in names:
        path = os.path.join(directory, n)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            if now - os.fstat(fd).st_mtime < age_s:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # its engine lives
            os.unlink(path)
            removed.append(path)
        except OSError:
            continue
        finally:
            os.close(fd)
    return removed


def share_cpu_tensors(tensors: Sequence[Any], prefix: str = KV_PREFIX) -> list[SharedFile]:
    """Moves CPU tensors whose memory the peer cannot map (anonymous: vLLM's
    CPU backend allocates its KV cache with torch.zeros) into /dev/shm files,
    in place: each distinct storage is copied into a shared file mapping and
    every tensor on it is re-pointed there (same shape, strides and offset),
    so the engine, which holds these very tensor objects, reads and writes
    the shared copy from then on. Call it before the engine's first forward.
    Returns the files made, each locked while this process lives; the caller
    closes them when its session ends. Orphans of killed engines are swept
    first (sweep_orphans)."""
    made: list[SharedFile] = []
    maps = _read_maps()
    by_storage: dict[int, list[Any]] = {}
    for t in tensors:
        if t.device.type != "cpu":
            continue
        st = _storage(t)
        try:
            resolve_file_range(st.data_ptr(), max(1, st.nbytes()), maps)
            continue  # already shareable
        except NotFileBacked:
            by_storage.setdefault(st.data_ptr(), []).append(t)
    if by_storage:
        sweep_orphans(prefix)
    try:
        for group in by_storage.values():
            made.append(_share_storage(group, prefix))
    except BaseException:
        for f in made:  # the tensors moved so far keep their (now private) mappings
            f.close()
        raise
    return made


def _share_storage(group: Sequence[Any], prefix: str) -> SharedFile:
    """Moves the tensors of one storage into a new locked shared file."""
    import fcntl

    import torch

    nbytes = _storage(group[0]).nbytes()
    fd, path = tempfile.mkstemp(prefix=prefix, dir=shared_dir())
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)  # held while this process lives: not an orphan
        try:
            # Reserve the memory now: a sparse file that outgrew /dev/shm would
            # fail the copy below with SIGBUS, killing the engine unexplained.
            os.posix_fallocate(fd, 0, nbytes)
        except OSError as e:
            raise BufferError_(f"cannot hold the {nbytes}-byte KV cache in {path}: {e.strerror} "
                               f"(free space in {os.path.dirname(path)}?)") from e
        flat = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        first = group[0]
        whole = first.new_empty(0).set_(first)  # the whole old storage, as first's dtype
        whole = whole.as_strided((nbytes // first.element_size(),), (1,), 0)
        flat.view(first.dtype).copy_(whole)
        for t in group:
            size, stride, offset = t.size(), t.stride(), t.storage_offset()
            t.set_(flat.view(t.dtype)).as_strided_(size, stride, offset)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    return SharedFile(fd, path, nbytes)


def _storage(t: Any) -> Any:
    """The tensor's whole storage (untyped where torch has it)."""
    return t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()


# --- planes ----------------------------------------------------------------


def _dense_block(t: Any) -> tuple[int, str]:
    """Bytes of one block of plane ``t`` (dim 0 = block) and the order of its
    inner dims; raises unless the inner dims are dense."""
    dims = [(t.stride(i), t.size(i), i) for i in range(1, t.dim()) if t.size(i) > 1]
    dims.sort()
    expected = 1
    for stride, size, _ in dims:
        if stride != expected:
            raise BufferError_(f"KV block is not dense (shape {tuple(t.shape)}, strides {t.stride()})")
        expected *= size
    order = "".join(str(i) for _, _, i in sorted(dims, reverse=True))
    return expected * t.element_size(), order


def _check_cpu(t: Any) -> None:
    if t.device.type not in ("cpu", "cuda"):
        raise BufferError_(f"unsupported KV device {t.device}")


# --- CUDA IPC ----------------------------------------------------------------

IPC_HANDLE_BYTES = 64


def ipc_handle_bytes(raw: bytes) -> bytes:
    """The 64-byte cudaIpcMemHandle_t of a torch storage handle. torch >= 2.5
    prefixes it with a format-version byte and a kind byte: ``c`` for a
    cudaMalloc block, ``e`` for an expandable segment (a file-descriptor
    handle CUDA IPC cannot open)."""
    raw = bytes(raw)
    if len(raw) == IPC_HANDLE_BYTES + 2:
        if raw[1:2] != b"c":
            raise BufferError_(
                f"CUDA KV storage is an expandable segment (handle kind {raw[1:2]!r}); the peer opens "
                "cudaMalloc blocks only: start the engine with PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False"
            )
        raw = raw[2:]
    if len(raw) != IPC_HANDLE_BYTES:
        raise BufferError_(f"unexpected CUDA IPC handle of {len(raw)} bytes")
    return raw


@dataclasses.dataclass(frozen=True)
class _CudaStorage:
    handle: bytes  # 64 bytes
    device: int
    offset: int  # storage's bytes from the start of the cudaMalloc block
    size: int  # storage bytes
    base: int  # storage data pointer in this process


def cuda_storage(t: Any) -> _CudaStorage:
    """The IPC description of the storage behind CUDA tensor ``t``."""
    st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()._untyped()
    # (device, handle, storage bytes, offset in block, ref counter handle, ref
    # counter offset, event handle, event sync required)
    share = st._share_cuda_()
    return _CudaStorage(ipc_handle_bytes(share[1]), int(share[0]), int(share[3]), int(share[2]), int(st.data_ptr()))


def _cuda_segment(t: Any, extent: int, storages: dict, buffers: list) -> tuple[int, int]:
    """(buffer index, offset of t's first byte in it) for CUDA plane t."""
    cs = cuda_storage(t)
    off = int(t.data_ptr()) - cs.base
    if off < 0 or off + extent > cs.size:
        raise BufferError_(f"CUDA plane [{off}, +{extent}) lies outside its storage of {cs.size} bytes")
    key = (cs.device, cs.handle, cs.offset)
    if key not in storages:
        storages[key] = len(buffers)
        buffers.append(CudaIpcBuffer(cs.handle, cs.device, cs.offset, cs.size))
    return storages[key], off


def describe_planes(planes: Sequence[Sequence[Any]]) -> KVDescription:
    """Describes ``planes[layer][plane]`` tensors (dim 0 = engine block)."""
    if not planes or any(len(p) != 2 for p in planes):
        raise BufferError_("need two planes (K, V) for every layer")
    on_cuda = planes[0][0].device.type == "cuda"
    maps = None if on_cuda else _read_maps()
    paths: dict[Any, int] = {}
    buffers: list[Buffer] = []
    segments: list[Segment] = []
    first = planes[0][0]
    num_blocks, dtype, order = first.size(0), first.dtype, ""
    for layer, pair in enumerate(planes):
        for plane, t in enumerate(pair):
            _check_cpu(t)
            if (t.device.type == "cuda") != on_cuda:
                raise BufferError_(f"layer {layer} plane {plane}: KV planes mix CPU and CUDA tensors")
            if t.size(0) != num_blocks or t.dtype != dtype:
                raise BufferError_(f"layer {layer} plane {plane}: blocks/dtype differ from layer 0")
            block_bytes, order = _dense_block(t)
            stride = t.stride(0) * t.element_size()
            if num_blocks > 1 and stride < block_bytes:
                raise BufferError_(f"layer {layer} plane {plane}: blocks overlap")
            extent = (num_blocks - 1) * stride + block_bytes
            if on_cuda:
                buf, off = _cuda_segment(t, extent, paths, buffers)
                segments.append(Segment(layer, plane, buf, off, stride, block_bytes))
                continue
            path, off = resolve_file_range(t.data_ptr(), extent, maps)
            if path not in paths:
                paths[path] = len(buffers)
                buffers.append(ShmBuffer(path, os.path.getsize(path)))
            segments.append(Segment(layer, plane, paths[path], off, stride, block_bytes))
    if on_cuda and len({b.device for b in buffers}) > 1:
        raise BufferError_(f"KV planes span CUDA devices {sorted({b.device for b in buffers})}: one session per device")
    name = DTYPE_NAMES.get(str(dtype), str(dtype).replace("torch.", ""))
    return KVDescription(tuple(buffers), tuple(segments), num_blocks, name, order)


# --- engine layouts ----------------------------------------------------------


# vLLM's per-layer KV tensors come in three shapes; each names the byte
# layout of the pages it produces (part of every key's fingerprint, so pages
# of different layouts never mix):
#
#   flash       (2, num_blocks, block_size, kv_heads, head_dim)     vLLM < 0.26, FLASH_ATTN
#   flashinfer  (num_blocks, 2, block_size, kv_heads, head_dim)     vLLM < 0.26, FLASHINFER
#   packed      logical (num_blocks, kv_heads, block_size, 2*head_dim), K and V packed
#               into the last dim (vLLM >= 0.26, PR#44455)
#
# Strides say the physical order inside a block: NHD (token-major) or HND
# (head-major; VLLM_KV_CACHE_LAYOUT=HND, or a backend that requires it).
# flash and flashinfer yield K and V planes of one block each; token-major,
# a page of such blocks is the page's tokens in order whatever the block size:
# byte layout "vllm-flash" (the two shapes are interchangeable). A packed
# block is one dense run of bytes holding K and V interleaved per (token,
# head); it is registered as its two halves (the peer copies segments as
# opaque bytes, plane by plane), so a page holds, per half, its blocks' bytes
# in order: that depends on the block size, which the name carries, as it
# does for head-major flash blocks:
#   "vllm-flash"                NHD, 5-D
#   "vllm-flash-hnd-b<B>"       HND, 5-D, B-token blocks
#   "vllm-packed-<nhd|hnd>-b<B>"  packed, B-token blocks
# Anything else (MLA caches, padded or sparse blocks) is refused: guessing is
# how LMCache and Dynamo served wrong KV on vLLM 0.26.


def vllm_byte_layout_name(kind: str, order: str, block_tokens: int) -> str:
    """The byte layout of pages from vLLM blocks of ``kind`` ("flash" for
    the 5-D shapes, "packed"), inner ``order`` ("nhd"/"hnd") and size."""
    if kind == "flash" and order == "nhd":
        return "vllm-flash"
    if kind == "flash":
        return f"vllm-flash-hnd-b{block_tokens}"
    return f"vllm-packed-{order}-b{block_tokens}"


@dataclasses.dataclass(frozen=True)
class VllmKV:
    """Per-layer planes of vLLM KV tensors and the byte layout they make."""

    planes: list
    byte_layout: str


def vllm_planes(kv_caches: Union[Mapping[str, Any], Sequence[Any]], layout: str = "auto") -> list[list[Any]]:
    """Per-layer (K, V) planes of vLLM per-layer KV tensors, in layer order
    (see vllm_kv for the byte layout they make)."""
    return vllm_kv(kv_caches, layout).planes


def vllm_kv(kv_caches: Union[Mapping[str, Any], Sequence[Any]], layout: str = "auto",
            head_dim: Optional[int] = None, prefer: str = "nhd") -> VllmKV:
    """Planes and byte layout of vLLM's per-layer KV tensors. ``layout`` is
    "auto" (from each tensor's rank and shape), "flash", "flashinfer" or
    "packed"; ``head_dim`` (when known) checks a packed tensor's last dim;
    ``prefer`` ("nhd"/"hnd", or a byte layout name holding one) is the order
    of a block whose strides cannot tell (one head or one token per block:
    both orders are the same bytes)."""
    tensors = list(kv_caches.values()) if isinstance(kv_caches, Mapping) else list(kv_caches)
    if not tensors:
        raise BufferError_("no KV tensors")
    pref = "hnd" if "hnd" in prefer else "nhd"
    out, names = [], set()
    for t in tensors:
        kind = layout if layout != "auto" else vllm_layout_of(t)
        if kind in ("flash", "flashinfer"):
            planes = [t[0], t[1]] if kind == "flash" else [t[:, 0], t[:, 1]]
            # plane dims: (blocks, block_size, heads, head_dim)
            order = _order(planes[0], tokens_dim=1, heads_dim=2, prefer=pref)
            out.append(planes)
            names.add(vllm_byte_layout_name("flash", order, t.size(2)))
        elif kind == "packed":
            planes, order = _packed_halves(t, head_dim, pref)
            out.append(planes)
            names.add(vllm_byte_layout_name("packed", order, t.size(2)))
        else:
            raise BufferError_(f"unknown vLLM KV layout {kind!r} (want flash, flashinfer or packed)")
    if len(names) != 1:
        raise BufferError_(f"vLLM KV tensors mix byte layouts {sorted(names)}")
    return VllmKV(out, names.pop())


def _order(t: Any, tokens_dim: int, heads_dim: int, prefer: str) -> str:
    """"nhd" when tokens are outer to heads in memory, "hnd" when heads are."""
    if t.size(tokens_dim) > 1 and t.size(heads_dim) > 1:
        return "nhd" if t.stride(tokens_dim) > t.stride(heads_dim) else "hnd"
    return prefer  # one head or one token per block: both orders are the same bytes


def vllm_layout_of(t: Any) -> str:
    """The shape family of one vLLM KV tensor (see the table above)."""
    if t.dim() == 4:
        return "packed"
    if t.dim() != 5:
        raise BufferError_(f"vLLM KV tensor must be 4-D (packed) or 5-D, got shape {tuple(t.shape)} (MLA is not supported)")
    if t.size(0) == 2 and t.size(1) != 2:
        return "flash"
    if t.size(1) == 2 and t.size(0) != 2:
        return "flashinfer"
    raise BufferError_(f"ambiguous vLLM KV shape {tuple(t.shape)}: set kv_layout to 'flash' or 'flashinfer'")


def _packed_halves(t: Any, head_dim: Optional[int], prefer: str) -> tuple[list[Any], str]:
    """A packed (blocks, heads, block_size, 2*hd) tensor as two planes, the
    first and second half of every block's bytes, and its inner order."""
    if t.dim() != 4:
        raise BufferError_(f"packed vLLM KV tensor must be 4-D, got shape {tuple(t.shape)}")
    if t.size(3) % 2 or (head_dim and t.size(3) != 2 * head_dim):
        raise BufferError_(f"packed vLLM KV tensor {tuple(t.shape)}: last dim must be 2*head_dim"
                           + (f" = {2 * head_dim}" if head_dim else ""))
    if t.stride(3) != 1:
        raise BufferError_(f"packed vLLM KV tensor {tuple(t.shape)}: the K|V dim is not innermost (strides {t.stride()})")
    block_bytes, _ = _dense_block(t)
    order = _order(t, tokens_dim=2, heads_dim=1, prefer=prefer)
    half = block_bytes // t.element_size() // 2
    import torch  # the engine's torch; only needed for this view

    view = torch.as_strided(t, (t.size(0), 2, half), (t.stride(0), half, 1), t.storage_offset())
    return [view[:, 0], view[:, 1]], order


def sglang_planes(k_buffers: Sequence[Any], v_buffers: Sequence[Any], page_size: int) -> list[list[Any]]:
    """Per-layer planes of SGLang's token-indexed K and V buffers
    ((tokens, heads, dim) per layer), viewed as pages of ``page_size`` tokens."""
    if len(k_buffers) != len(v_buffers):
        raise BufferError_("K and V buffer lists differ in length")
    out = []
    for k, v in zip(k_buffers, v_buffers):
        pages = k.size(0) // page_size
        out.append([x[: pages * page_size].unflatten(0, (pages, page_size)) for x in (k, v)])
    return out
