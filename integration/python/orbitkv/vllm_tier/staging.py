"""Where the peer reads and writes the tier's rows.

Zero copy (``PoolRegion``): vLLM's tiering spec keeps its CPU pool in a
shared file mapping (/dev/shm/vllm_offload_<engine id>.mmap); when that file
is still linked and the peer can open it, the peer is given the pool itself
and copies rows straight between it and its own pages.

One copy (``StagingRegion``): otherwise (the file was unlinked, or the peer
runs where it cannot see the engine's /dev/shm) the tier makes a file of
``slots`` rows in a directory the peer can open, copies a row into a slot
before a store and out of a slot after a load, and frees the slot when the
job ends. A job larger than the free slots goes in parts as slots free up
(orbitkv.vllm_tier.link); rows still without a slot at the job's abandon
time fail (a store dropped, a load a miss): the staging region bounds the
bytes in flight.

Either way a region is rows of ``row_bytes`` bytes; ``blocks`` says which
rows of the region the peer touches for a job.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import tempfile
from typing import Optional, Sequence

import numpy as np

from orbitkv import buffers
from orbitkv.buffers import Segment, ShmBuffer
from orbitkv.errors import NotFileBacked

STAGING_PREFIX = "orbitkv-vtier-"
# staging_chunks 0: the staging region holds this many bytes of rows (at
# least AUTO_MIN_SLOTS rows, at most the pool's). Each part of a job is a peer
# round trip of the tier's worker: measured on an H100 (2026-12-06), 64 slots
# of Qwen3-8B's 2.25 MiB rows cut an 8K-token promotion into 8 parts.
AUTO_STAGING_BYTES = 1 << 30
AUTO_MIN_SLOTS = 64


def staging_slots(configured: int, pool_rows: int, row_bytes: int) -> int:
    """The staging region's rows: ``configured``, or for 0 as many as
    AUTO_STAGING_BYTES holds, at least AUTO_MIN_SLOTS, at most the pool's."""
    if configured > 0:
        return configured
    return max(1, min(pool_rows, max(AUTO_MIN_SLOTS, AUTO_STAGING_BYTES // max(1, row_bytes))))


def pool_array(view: memoryview) -> np.ndarray:
    """vLLM's primary view (num_chunks, row_bytes) as a uint8 array, no copy."""
    arr = np.asarray(view)
    if arr.ndim != 2 or arr.dtype.itemsize != 1:
        raise ValueError(f"orbitkv tier: unexpected CPU pool view {arr.shape} {arr.dtype}")
    return arr.view(np.uint8)


def _segments(offset: int, row_bytes: int) -> tuple[Segment, Segment]:
    half = row_bytes // 2
    return (Segment(0, 0, 0, offset, row_bytes, half), Segment(0, 1, 0, offset + half, row_bytes, half))


class PoolRegion:
    """The peer maps vLLM's pool file: blocks are chunk ids, nothing is copied."""

    zero_copy = True

    def __init__(self, pool: np.ndarray) -> None:
        self.pool = pool
        rows, row_bytes = pool.shape
        path, offset = buffers.resolve_file_range(pool.ctypes.data, rows * row_bytes)
        self.path = path
        self.buffer = ShmBuffer(path, os.path.getsize(path))
        self.segments = _segments(offset, row_bytes)
        self.num_blocks = rows

    @classmethod
    def try_open(cls, pool: np.ndarray) -> Optional["PoolRegion"]:
        """None when the pool is not a shared file the peer could open."""
        try:
            return cls(pool)
        except (NotFileBacked, OSError):
            return None

    def available(self) -> int:
        return self.num_blocks

    def for_store(self, chunk_ids: Sequence[int]) -> Optional[list[int]]:
        return [int(c) for c in chunk_ids]

    def for_load(self, chunk_ids: Sequence[int]) -> Optional[list[int]]:
        return [int(c) for c in chunk_ids]

    def finish_load(self, blocks: Sequence[int], chunk_ids: Sequence[int]) -> None:
        return

    def free(self, blocks: Sequence[int]) -> None:
        return

    def close(self) -> None:
        self.pool = None


def _run(slots: Sequence[int]) -> Optional[slice]:
    """The slice slots are, when they are consecutive ascending slots."""
    lo = slots[0]
    if all(s == lo + i for i, s in enumerate(slots)):
        return slice(lo, lo + len(slots))
    return None


class StagingRegion:
    """A file of ``slots`` rows the peer maps; one copy each way."""

    zero_copy = False

    def __init__(self, pool: np.ndarray, slots: int, directory: str) -> None:
        self.pool = pool
        row_bytes = pool.shape[1]
        size = slots * row_bytes
        fd, self.path = tempfile.mkstemp(prefix=STAGING_PREFIX, dir=directory)
        try:
            # Reserve the memory now: a sparse file that outgrew its directory
            # would fail a later copy with SIGBUS.
            os.posix_fallocate(fd, 0, size)
            self._map = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            os.unlink(self.path)
            raise
        os.close(fd)
        self.rows = np.frombuffer(self._map, dtype=np.uint8).reshape(slots, row_bytes)
        self.buffer = ShmBuffer(self.path, size)
        self.segments = _segments(0, row_bytes)
        self.num_blocks = slots
        self._used = np.zeros(slots, dtype=bool)

    def available(self) -> int:
        """Free slots."""
        return int(self.num_blocks - np.count_nonzero(self._used))

    def _take(self, n: int) -> Optional[list[int]]:
        """n free slots, one run of them when there is one (its rows then
        copy in one call, _run), else the first n free; None if too few."""
        free = ~self._used
        if n <= 0 or n > np.count_nonzero(free):
            return None
        ends = np.cumsum(free, dtype=np.int64)  # free slots in [0, i]
        runs = ends[n - 1:] - np.concatenate(([0], ends[:-n]))  # free slots in [i, i + n)
        at = np.flatnonzero(runs == n)
        slots = list(range(int(at[0]), int(at[0]) + n)) if at.size else np.flatnonzero(free)[:n].tolist()
        self._used[slots] = True
        return slots

    # As a thread (worker "thread") the tier's worker shares vLLM's GIL with
    # its busy engine loop, so a copy is one call (one GIL release), never a
    # loop of row copies: 512 row copies took 3.0-3.4 s under a busy loop
    # where one call took 0.5 s.
    # A run of slots is a view, so the gather or scatter needs no temporary
    # as large as the job (fresh pages, faulted in on every copy).

    def for_store(self, chunk_ids: Sequence[int]) -> Optional[list[int]]:
        """Slots holding copies of these pool rows (a store), or None if full."""
        slots = self._take(len(chunk_ids))
        if slots is not None:
            ids = np.asarray(chunk_ids, dtype=np.int64)
            run = _run(slots)
            if run is not None:
                np.take(self.pool, ids, axis=0, out=self.rows[run])
            else:
                self.rows[slots] = self.pool[ids]
        return slots

    def for_load(self, chunk_ids: Sequence[int]) -> Optional[list[int]]:
        """Slots for a load to fill, or None if full."""
        return self._take(len(chunk_ids))

    def finish_load(self, slots: Sequence[int], chunk_ids: Sequence[int]) -> None:
        """Copies loaded slots into their pool rows."""
        if not slots:
            return
        run = _run(slots)
        self.pool[np.asarray(chunk_ids, dtype=np.int64)] = self.rows[run] if run is not None else self.rows[list(slots)]

    def free(self, slots: Sequence[int]) -> None:
        self._used[list(slots)] = False

    def close(self) -> None:
        with contextlib.suppress(OSError):
            os.unlink(self.path)
        self.rows = self.pool = None
        with contextlib.suppress(BufferError, ValueError):
            self._map.close()
