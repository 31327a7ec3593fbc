"""Page names and host indices as SGLang's HiCache passes them to a storage
backend (shared by the stand-in and the real-SGLang tests)."""

from __future__ import annotations

import hashlib

import torch


def page_hashes(n: int, salt: str = "") -> list[str]:
    """n chained page hashes (hex), like SGLang's prefix hashes."""
    out, prev = [], b""
    for i in range(n):
        h = hashlib.sha256(prev + f"{salt}{i}".encode()).hexdigest()
        out.append(h)
        prev = h.encode()
    return out


def token_indices(pages, page_size: int) -> torch.Tensor:
    """The host-pool token indices of whole pages."""
    return torch.tensor([p * page_size + t for p in pages for t in range(page_size)], dtype=torch.int64)
