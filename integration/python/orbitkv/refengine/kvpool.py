"""The paged KV pool: one allocation, viewed per layer in vLLM's FlashAttention layout.

On CPU the pool is a file under /dev/shm mapped shared, so another process (the OrbitKV peer)
can map the same bytes; on CUDA it is a plain device tensor. Either way the whole pool is ONE
contiguous buffer of shape (layers, 2, num_blocks, block_size, kv_heads, head_dim); layer l's
tensor is the view [l] with shape (2, num_blocks, block_size, kv_heads, head_dim): plane 0 is
K, plane 1 is V, and block b of a plane occupies
    offset(l, p) + b * block_bytes,   offset(l, p) = (l * 2 + p) * num_blocks * block_bytes
bytes from the start of the buffer.
"""

from __future__ import annotations

import itertools
import os
from typing import Dict, List, Optional

import torch

from .config import EngineConfig

_counter = itertools.count()


def layer_name(i: int) -> str:
    """vLLM's attention layer name for layer i (the key of register_kv_caches)."""
    return f"model.layers.{i}.self_attn.attn"


class KVPool:
    """Owns the KV bytes. close() is idempotent and removes the backing file."""

    def __init__(self, cfg: EngineConfig):
        m = cfg.model
        self.num_layers = m.num_layers
        self.num_blocks = cfg.num_blocks
        self.block_size = cfg.block_size
        self.kv_heads = m.num_kv_heads
        self.head_dim = m.head_dim
        self.dtype = m.torch_dtype
        self.device = torch.device(cfg.device)
        self.block_bytes = self.block_size * self.kv_heads * self.head_dim * m.dtype_bytes
        self.nbytes = self.num_layers * 2 * self.num_blocks * self.block_bytes
        self.shm_path: Optional[str] = None
        shape = (self.num_layers, 2, self.num_blocks, self.block_size, self.kv_heads, self.head_dim)
        if self.device.type == "cpu":
            self.shm_path = os.path.join(cfg.shm_dir, f"orbitkv-refengine-{os.getpid()}-{next(_counter)}")
            fd = os.open(self.shm_path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
            try:
                os.ftruncate(fd, self.nbytes)
            finally:
                os.close(fd)
            raw = torch.from_file(self.shm_path, shared=True, size=self.nbytes, dtype=torch.uint8)
            self.buffer = raw.view(self.dtype).view(shape)
        else:
            self.buffer = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.layers: List[torch.Tensor] = [self.buffer[i] for i in range(self.num_layers)]
        self._closed = False

    def kv_caches(self) -> Dict[str, torch.Tensor]:
        """Layer name -> (2, num_blocks, block_size, kv_heads, head_dim) view."""
        return {layer_name(i): t for i, t in enumerate(self.layers)}

    def segment_offset(self, layer: int, plane: int) -> int:
        """Bytes from the buffer start to block 0 of (layer, plane)."""
        return (layer * 2 + plane) * self.num_blocks * self.block_bytes

    def describe(self) -> dict:
        """What a connector needs to register the pool with a peer."""
        return {
            "shm_path": self.shm_path, "nbytes": self.nbytes, "num_blocks": self.num_blocks,
            "block_size": self.block_size, "block_bytes": self.block_bytes,
            "num_layers": self.num_layers, "kv_heads": self.kv_heads, "head_dim": self.head_dim,
            "byte_layout": "vllm-flash",
        }

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.layers = []
        self.buffer = None
        if self.shm_path:
            try:
                os.unlink(self.shm_path)
            except FileNotFoundError:
                pass

    def __del__(self):  # last resort; callers close() explicitly
        try:
            self.close()
        except Exception:
            pass
