"""The tier's page layout and page keys.

One page is one chunk of vLLM's CPU pool: a row of ``row_bytes`` bytes (every
worker's slice of the chunk's blocks, in rank order, padded to the OS page
size), copied as opaque bytes. The peer registers rows as blocks of a one-layer
layout whose two planes are the row's halves (the peer wants one K and one V
segment per layer; it copies both as bytes, so the split is bookkeeping).

What makes two engines' rows interchangeable is vLLM's chunk format, not
heads and dims: the byte layout name carries a digest of it (model, cache
dtype, tokens per block and per hash, blocks per chunk, the KV cache groups
and their layers, the parallel sizes unless vLLM calls the bytes
parallelism-agnostic, the replicated and canonical layouts, the row size).
The layout fingerprint (orbitkv.keys) covers that name, so rows of another
format never answer a lookup.

Page key = SHA-256("orbitkv.vtier.v1" ‖ fp ‖ u32(len(hash)) ‖ block hash ‖
u32(group))[:16], where block hash and group are vLLM's OffloadKey. vLLM's
block hash already chains the whole prefix (each block's hash covers its
parent's), so chaining it under the fingerprint gives a key that another
engine's tier, with the same format and the same hash seed, derives for the
same prefix. The domain string keeps these keys apart from the connector's
token-chained keys (orbitkv.keys.next_key, whose preimage starts with the
fingerprint): the tier and the connector never share pages (their byte
layouts differ too: the connector's pages are per-layer K/V planes of its
page size, the tier's are vLLM's CPU rows).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import struct
from typing import Any

from orbitkv.keys import KEY_SIZE, Layout

_KEY_DOMAIN = b"orbitkv.vtier.v1"
BYTE_LAYOUT_PREFIX = "vllm-offload-row-v1-"
_MAX_PAGE_TOKENS = 1 << 16


@dataclasses.dataclass(frozen=True)
class RowFormat:
    """vLLM's chunk format, as its OffloadingSpec describes it."""

    model: str
    dtype: str
    row_bytes: int
    tokens_per_hash: int
    blocks_per_chunk: int
    groups: tuple  # ((tokens_per_block, (layer names…)), …)
    parallel: tuple  # (world, tp, pp, pcp, dcp), or () when parallelism-agnostic
    replicated: bool = False
    canonical: str = ""  # the canonical KV cache layout, "" for the direct one

    @classmethod
    def from_spec(cls, spec: Any, row_bytes: int) -> "RowFormat":
        """From a vLLM OffloadingSpec (``spec.config``) and the pool's row size."""
        c = spec.config
        p = c.parallel
        agnostic = bool(p.is_parallelism_agnostic)
        return cls(
            model=str(c.model.name),
            dtype=str(c.model.dtype),
            row_bytes=int(row_bytes),
            tokens_per_hash=int(c.cache.tokens_per_hash),
            blocks_per_chunk=int(c.cache.blocks_per_chunk),
            groups=tuple((int(g.tokens_per_block), tuple(g.layer_names)) for g in c.groups),
            parallel=() if agnostic else (p.world_size, p.tp_size, p.pp_size, p.pcp_size, p.dcp_size),
            replicated=bool(getattr(c, "replicated_layout", False)),
            canonical=str(c.kv_cache_layout or "") if getattr(c, "canonical_layout", False) else "",
        )

    def digest(self) -> str:
        body = json.dumps(dataclasses.asdict(self), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(body.encode()).hexdigest()[:24]

    @property
    def page_tokens(self) -> int:
        tokens = self.groups[0][0] * self.blocks_per_chunk if self.groups else 1
        return max(1, min(tokens, _MAX_PAGE_TOKENS))

    def layout(self, revision: str = "") -> Layout:
        """The peer layout of these rows: one layer, two planes of half a row."""
        if self.row_bytes <= 0 or self.row_bytes % 2:
            raise ValueError(f"orbitkv tier: a row of {self.row_bytes} bytes cannot be split in two planes")
        return Layout(self.model, revision, "u8", 1, 1, 1, 0, 1, self.page_tokens,
                      BYTE_LAYOUT_PREFIX + self.digest())


def page_key(fp: bytes, offload_key: bytes) -> bytes:
    """The page key of a vLLM OffloadKey (block hash ‖ u32 BE group index)."""
    if len(fp) != KEY_SIZE:
        raise ValueError("fingerprint must be 16 bytes")
    block_hash, group = bytes(offload_key[:-4]), bytes(offload_key[-4:])
    h = hashlib.sha256(_KEY_DOMAIN)
    h.update(fp)
    h.update(struct.pack("<I", len(block_hash)))
    h.update(block_hash)
    h.update(struct.pack("<I", int.from_bytes(group, "big")))
    return h.digest()[:KEY_SIZE]
