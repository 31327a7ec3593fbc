"""A shared-memory staging buffer of page slots for host pools the peer
cannot map (the extra host copy of the SGLang backend)."""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
from typing import Any, Iterator

from orbitkv.sglang.hostpool import PoolGeometry, page_view

_ACQUIRE_TIMEOUT_S = 60.0


class Staging:
    """``slots`` pages laid out (layers, 2, slots, page_size, heads, dim) in
    one /dev/shm file; slot s of layer l, plane p is a dense block."""

    def __init__(self, g: PoolGeometry, slots: int) -> None:
        import torch

        self.geo = g
        self.slots = max(1, slots)
        elem = torch.empty(0, dtype=g.dtype).element_size()
        shape = (g.layers, 2, self.slots, g.page_size, g.heads, g.head_dim)
        nbytes = elem
        for d in shape:
            nbytes *= d
        fd, self.path = tempfile.mkstemp(prefix="orbitkv-staging-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None)
        os.close(fd)
        self.tensor = torch.from_file(self.path, shared=True, size=nbytes, dtype=torch.uint8).view(g.dtype).view(shape)
        self._free = list(range(self.slots))
        self._cv = threading.Condition()

    def planes(self) -> list[list[Any]]:
        return [[self.tensor[l, p] for p in (0, 1)] for l in range(self.geo.layers)]

    def slot_view(self, slot: int) -> Any:
        """(layers, 2, page_size, heads, dim) view of one slot."""
        return self.tensor[:, :, slot]

    @contextlib.contextmanager
    def acquire(self, n: int) -> Iterator[list[int]]:
        if n > self.slots:
            raise ValueError(f"{n} staging slots asked, {self.slots} exist")
        with self._cv:
            if not self._cv.wait_for(lambda: len(self._free) >= n, timeout=_ACQUIRE_TIMEOUT_S):
                raise TimeoutError("orbitkv staging slots exhausted")
            got, self._free = self._free[:n], self._free[n:]
        try:
            yield got
        finally:
            with self._cv:
                self._free += got
                self._cv.notify_all()

    def from_host(self, pool: Any, slot: int, page: int) -> None:
        self.slot_view(slot).copy_(page_view(pool, self.geo, page))

    def to_host(self, pool: Any, slot: int, page: int) -> None:
        page_view(pool, self.geo, page).copy_(self.slot_view(slot))

    def close(self) -> None:
        self.tensor = None
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
