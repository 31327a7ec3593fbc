"""SGLang HiCache storage backend for OrbitKV (``--hicache-storage-backend dynamic``,
``module_path: orbitkv.sglang``, ``class_name: OrbitKVHiCacheStorage``)."""

from orbitkv.sglang.backend import OrbitKVHiCacheStorage

__all__ = ["OrbitKVHiCacheStorage"]
