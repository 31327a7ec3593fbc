"""SGLang's HiCache storage base types when SGLang is importable; minimal
compatible stand-ins otherwise."""

from __future__ import annotations

import abc
import dataclasses
import enum
from typing import Any, Dict, List, Optional

try:  # pragma: no cover - exercised only where SGLang is installed
    from sglang.srt.mem_cache.hicache_storage import (  # type: ignore
        HiCacheStorage,
        HiCacheStorageConfig,
        HiCacheStorageExtraInfo,
        PoolHitPolicy,
        PoolName,
        PoolTransfer,
        PoolTransferResult,
    )

    HAVE_SGLANG = True
except Exception:
    HAVE_SGLANG = False

try:  # pragma: no cover - exercised only where SGLang is installed
    from sglang.srt.observability.metrics_collector import StorageMetrics  # type: ignore
except Exception:

    @dataclasses.dataclass
    class StorageMetrics:  # type: ignore[no-redef]
        """What a backend's get_stats hands SGLang's storage metrics: one
        entry per operation since the last call."""

        prefetch_pgs: List[int] = dataclasses.field(default_factory=list)
        backup_pgs: List[int] = dataclasses.field(default_factory=list)
        prefetch_bandwidth: List[float] = dataclasses.field(default_factory=list)
        backup_bandwidth: List[float] = dataclasses.field(default_factory=list)

    @dataclasses.dataclass
    class HiCacheStorageConfig:  # type: ignore[no-redef]
        tp_rank: int = 0
        tp_size: int = 1
        pp_rank: int = 0
        pp_size: int = 1
        attn_cp_rank: int = 0
        attn_cp_size: int = 1
        is_mla_model: bool = False
        enable_storage_metrics: bool = False
        is_page_first_layout: bool = False
        model_name: Optional[str] = None
        tp_lcm_size: Optional[int] = None
        should_split_heads: bool = False
        extra_config: Optional[dict] = None

    class PoolName(str, enum.Enum):  # type: ignore[no-redef]
        KV = "kv"
        MAMBA = "mamba"
        SWA = "swa"
        INDEXER = "indexer"
        DRAFT = "draft"

        def __str__(self) -> str:
            return self.value

    class PoolHitPolicy(str, enum.Enum):  # type: ignore[no-redef]
        ALL_PAGES = "all_pages"
        TRAILING_PAGES = "trailing_pages"

    @dataclasses.dataclass
    class PoolTransfer:  # type: ignore[no-redef]
        name: Any
        host_indices: Any = None
        device_indices: Any = None
        keys: Optional[List[str]] = None
        hit_policy: Any = PoolHitPolicy.ALL_PAGES
        nodes_to_load: Optional[List[Any]] = None
        indices_from_pool: Any = None

    @dataclasses.dataclass
    class PoolTransferResult:  # type: ignore[no-redef]
        kv_hit_pages: int
        extra_pool_hit_pages: Dict[str, int]

    @dataclasses.dataclass
    class HiCacheStorageExtraInfo:  # type: ignore[no-redef]
        prefix_keys: Optional[List[str]] = None
        extra_info: Optional[dict] = None

    class HiCacheStorage(abc.ABC):  # type: ignore[no-redef]
        """The parts of SGLang's HiCacheStorage a backend implements."""

        def register_mem_pool_host(self, mem_pool_host: Any) -> None:
            self.mem_pool_host = mem_pool_host

        def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
            if not hasattr(self, "registered_pools"):
                self.registered_pools = {}
            self.registered_pools[host_pool_name] = host_pool

        def batch_exists_v2(self, keys: List[str], pool_transfers: Any = None, extra_info: Any = None) -> Any:
            raise NotImplementedError

        def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> Dict[str, List[bool]]:
            raise NotImplementedError

        def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> Dict[str, List[bool]]:
            raise NotImplementedError

        @abc.abstractmethod
        def get(self, key: str, target_location: Any = None, target_sizes: Any = None) -> Any: ...

        @abc.abstractmethod
        def batch_get(self, keys: List[str], target_locations: Any = None, target_sizes: Any = None) -> Any: ...

        @abc.abstractmethod
        def set(self, key: str, value: Any = None, target_location: Any = None, target_sizes: Any = None) -> bool: ...

        @abc.abstractmethod
        def batch_set(self, keys: List[str], values: Any = None, target_locations: Any = None, target_sizes: Any = None) -> bool: ...

        @abc.abstractmethod
        def exists(self, key: str) -> bool: ...

        def batch_exists(self, keys: List[str], extra_info: Any = None) -> int:
            for i, k in enumerate(keys):
                if not self.exists(k):
                    return i
            return len(keys)

        def batch_get_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
            raise NotImplementedError

        def batch_set_v1(self, keys: List[str], host_indices: Any, extra_info: Any = None) -> List[bool]:
            raise NotImplementedError

        def clear(self) -> None:
            return None

        def get_stats(self) -> Any:
            return None


def build_mha_host_pool(device_pool: Any, host_to_device_ratio: float, host_size: int, page_size: int,
                        layout: str, **kwargs: Any) -> Any:
    """SGLang's MHA host pool (MHATokenToKVPoolHost) over an MHA device pool,
    built the way the installed SGLang builds it (for the tests and
    scripts/bench-sglang-path.py; a server builds its own). SGLang 0.5.17
    takes the device pool itself; 0.5.23 takes the device pool's buffer
    description (``MHABufferInfo``) and its capacity and layer range, which
    its assembler derives with ``_mha_host_inputs``: that function is used
    here, so the pool is the one a 0.5.23 server makes."""
    import inspect

    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # type: ignore

    params = inspect.signature(MHATokenToKVPoolHost.__init__).parameters
    if "buffer_info" not in params:  # SGLang 0.5.17
        return MHATokenToKVPoolHost(device_pool, host_to_device_ratio, host_size, page_size, layout, **kwargs)
    from sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler import _mha_host_inputs  # type: ignore

    cls, info, derived = _mha_host_inputs(device_pool)
    return cls(info, host_to_device_ratio, host_size, page_size, layout, **derived, **kwargs)


# SGLang 0.5.23's PoolTransferResult carries the set of prefix lengths every
# pool can restore (restorable_prefix_pages); 0.5.17's carries only a length.
RESTORABLE_SETS = "restorable_prefix_pages" in {f.name for f in dataclasses.fields(PoolTransferResult)}
