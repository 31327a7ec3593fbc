"""Views of SGLang's MHA host KV pool (``mem_pool_host.kv_buffer``).

Host layouts (token-indexed; a page is ``page_size`` consecutive slots):
  layer_first        (2, layers, size, heads, dim)
  page_first         (2, size, layers, heads, dim)
  page_first_direct  (2, pages, layers, page_size, heads, dim)
  page_head          (2, pages, heads, page_size, layers, dim)
The canonical OrbitKV page here is (layers, 2, page_size, heads, dim):
for every layer, K then V, each one dense block — the "sglang-mha" byte layout.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

BYTE_LAYOUT = "sglang-mha"


@dataclasses.dataclass(frozen=True)
class PoolGeometry:
    layout: str
    page_size: int
    layers: int
    heads: int
    head_dim: int
    num_pages: int
    dtype: Any


def geometry(pool: Any) -> PoolGeometry:
    """The pool's geometry; NotImplementedError for pools that are not an
    MHA K/V host pool (Mamba states, MLA latents, DeepSeek-V4 pools)."""
    kv = getattr(pool, "kv_buffer", None)
    if kv is None or getattr(kv, "dim", lambda: 0)() not in (5, 6):
        raise NotImplementedError(f"SGLang host pool {type(pool).__name__} is not an MHA K/V pool; the OrbitKV backend stores only those")
    layout = str(getattr(pool, "layout", "layer_first"))
    ps = int(pool.page_size)
    if layout == "layer_first":
        _, layers, size, heads, dim = kv.shape
        pages = size // ps
    elif layout == "page_first":
        _, size, layers, heads, dim = kv.shape
        pages = size // ps
    elif layout == "page_first_direct":
        _, pages, layers, _, heads, dim = kv.shape
    elif layout == "page_head":
        _, pages, heads, _, layers, dim = kv.shape
    else:
        raise NotImplementedError(f"SGLang host layout {layout!r} is not supported by the OrbitKV backend")
    return PoolGeometry(layout, ps, int(layers), int(heads), int(dim), int(pages), kv.dtype)


def page_view(pool: Any, g: PoolGeometry, page: int) -> Any:
    """The host page as a (layers, 2, page_size, heads, dim) view (strided)."""
    kv, ps = pool.kv_buffer, g.page_size
    if g.layout == "layer_first":
        return kv[:, :, page * ps : (page + 1) * ps].transpose(0, 1)
    if g.layout == "page_first":
        return kv[:, page * ps : (page + 1) * ps].permute(2, 0, 1, 3, 4)
    if g.layout == "page_head":
        return kv[:, page].permute(3, 0, 2, 1, 4)
    return kv[:, page].transpose(0, 1)


def direct_planes(pool: Any, g: PoolGeometry) -> Optional[list[list[Any]]]:
    """Block-major (K, V) planes over the pool itself, or None when a page
    of one layer is not one dense block (page_first, page_head)."""
    kv, ps = pool.kv_buffer, g.page_size
    if g.layout == "layer_first":
        return [[kv[p, l, : g.num_pages * ps].unflatten(0, (g.num_pages, ps)) for p in (0, 1)] for l in range(g.layers)]
    if g.layout == "page_first_direct":
        return [[kv[p, :, l] for p in (0, 1)] for l in range(g.layers)]
    return None


def flat_to_canonical(flat: Any, g: PoolGeometry) -> Any:
    """A page from ``get_data_page(flat=True)`` as (layers, 2, ps, heads, dim)."""
    ps, L, H, D = g.page_size, g.layers, g.heads, g.head_dim
    if g.layout == "layer_first":
        return flat.view(2, L, ps, H, D).transpose(0, 1)
    if g.layout == "page_first":
        return flat.view(2, ps, L, H, D).permute(2, 0, 1, 3, 4)
    if g.layout == "page_head":
        return flat.view(2, H, ps, L, D).permute(3, 0, 2, 1, 4)
    return flat.view(2, L, ps, H, D).transpose(0, 1)


def canonical_to_flat(canon: Any, g: PoolGeometry) -> Any:
    if g.layout == "page_first":
        return canon.permute(1, 2, 0, 3, 4).contiguous().flatten()
    if g.layout == "page_head":
        return canon.permute(1, 3, 2, 0, 4).contiguous().flatten()
    return canon.transpose(0, 1).contiguous().flatten()
