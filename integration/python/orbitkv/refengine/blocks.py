"""Block accounting with native prefix caching, in the manner of vLLM's BlockPool.

A block is `block_size` token slots of every layer's K and V. A full block may be *cached*:
registered under its block hash, the chained hash of its parent block's hash and its tokens,
so a later prompt with the same prefix reuses it. Free blocks (ref count 0) sit in one LRU
queue; a cached free block keeps its hash until it is handed out again (evicted) — that is
the only eviction. Decisions are plain state: no I/O, no threads.
"""

from __future__ import annotations

import collections
import hashlib
import struct
from typing import Dict, Iterable, List, Optional, Sequence

_NO_PARENT = b"\x00" * 16


def hash_block(parent: Optional[bytes], tokens: Sequence[int]) -> bytes:
    """128-bit chained block hash: SHA-256(parent ‖ tokens as little-endian u32)[:16]."""
    h = hashlib.sha256(parent or _NO_PARENT)
    h.update(struct.pack(f"<{len(tokens)}I", *tokens))
    return h.digest()[:16]


def extend_block_hashes(hashes: List[bytes], tokens: Sequence[int], block_size: int) -> None:
    """Append the hashes of the full blocks of `tokens` that `hashes` does not cover yet."""
    for i in range(len(hashes), len(tokens) // block_size):
        parent = hashes[i - 1] if i else None
        hashes.append(hash_block(parent, tokens[i * block_size:(i + 1) * block_size]))


class BlockPool:
    """Ref-counted blocks, an LRU free queue and the hash → block map of cached blocks."""

    def __init__(self, num_blocks: int, enable_caching: bool = True):
        self.num_blocks = num_blocks
        self.enable_caching = enable_caching
        self.ref_cnt = [0] * num_blocks
        self.block_hash: List[Optional[bytes]] = [None] * num_blocks
        self.free: "collections.OrderedDict[int, None]" = collections.OrderedDict(
            (b, None) for b in range(num_blocks))
        self.cached: Dict[bytes, int] = {}
        self.evictions = 0

    # -- queries ---------------------------------------------------------------------------
    def num_free(self) -> int:
        return len(self.free)

    def usage(self) -> float:
        """Fraction of blocks held by requests (cached free blocks count as free)."""
        return 1.0 - len(self.free) / self.num_blocks

    def cached_prefix(self, hashes: Iterable[bytes]) -> List[int]:
        """Block ids of the longest cached prefix of `hashes`. No side effects."""
        out: List[int] = []
        if not self.enable_caching:
            return out
        for h in hashes:
            b = self.cached.get(h)
            if b is None:
                break
            out.append(b)
        return out

    def num_free_after_touch(self, block_ids: Sequence[int]) -> int:
        """Free blocks left once `block_ids` (cache hits) are taken."""
        return len(self.free) - sum(1 for b in block_ids if self.ref_cnt[b] == 0)

    # -- transitions -----------------------------------------------------------------------
    def touch(self, block_ids: Sequence[int]) -> None:
        """Take a reference on cache-hit blocks."""
        for b in block_ids:
            if self.ref_cnt[b] == 0:
                del self.free[b]
            self.ref_cnt[b] += 1

    def allocate(self, n: int) -> Optional[List[int]]:
        """n blocks from the head of the free queue (evicting their cache entries), or None."""
        if n > len(self.free):
            return None
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            self._uncache(b)
            self.ref_cnt[b] = 1
            out.append(b)
        return out

    def release(self, block_ids: Sequence[int]) -> None:
        """Drop one reference on each block, in the given order (first freed = first evicted)."""
        for b in block_ids:
            if self.ref_cnt[b] <= 0:
                raise RuntimeError(f"block {b} released more often than taken")
            self.ref_cnt[b] -= 1
            if self.ref_cnt[b] == 0:
                self.free[b] = None

    def cache(self, block_id: int, block_hash: bytes) -> None:
        """Publish a computed full block under its hash (the first block with a hash wins)."""
        if not self.enable_caching or self.block_hash[block_id] is not None:
            return
        if block_hash in self.cached:
            return
        self.block_hash[block_id] = block_hash
        self.cached[block_hash] = block_id

    def reset(self) -> int:
        """Forget every cached free block's hash; returns how many were dropped."""
        dropped = 0
        for b in list(self.free):
            if self.block_hash[b] is not None:
                self._uncache(b)
                dropped += 1
        return dropped

    def _uncache(self, b: int) -> None:
        h = self.block_hash[b]
        if h is not None:
            self.block_hash[b] = None
            if self.cached.get(h) == b:
                del self.cached[h]
                self.evictions += 1
