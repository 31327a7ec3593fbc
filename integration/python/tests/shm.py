"""Shared-memory KV pools for tests, allocated like the reference engine's."""

from __future__ import annotations

import contextlib
import os
import tempfile

import torch


@contextlib.contextmanager
def shm_pool(nbytes: int):
    """Yields (path, uint8 tensor) backed by a fresh /dev/shm file."""
    fd, path = tempfile.mkstemp(prefix="okv-test-", dir="/dev/shm")
    os.close(fd)
    try:
        t = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        yield path, t
    finally:
        os.unlink(path)


def flash_layers(pool: torch.Tensor, layers: int, blocks: int, block: int, heads: int, dim: int, dtype=torch.float32):
    """Per-layer vLLM FlashAttention tensors (2, blocks, block, heads, dim) carved from pool."""
    per = 2 * blocks * block * heads * dim
    t = pool.view(dtype)[: layers * per].view(layers, 2, blocks, block, heads, dim)
    return {f"model.layers.{i}.self_attn.attn": t[i] for i in range(layers)}


def pool_bytes(layers: int, blocks: int, block: int, heads: int, dim: int, itemsize: int = 4) -> int:
    return layers * 2 * blocks * block * heads * dim * itemsize
