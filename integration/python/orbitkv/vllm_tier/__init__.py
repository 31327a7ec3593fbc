"""OrbitKV as a secondary tier of vLLM's own CPU offloading (vLLM >= 0.33,
``--kv-offloading-backend native`` with ``spec_name: TieringOffloadingSpec``).

    {"type": "OrbitKVTier", "module_path": "orbitkv.vllm_tier",
     "socket": "/run/orbitkv/orbitkv.sock"}

in ``kv_connector_extra_config.secondary_tiers``. vLLM loads the class by
that module path (``getattr(module, type)``); importing this package does not
import vLLM until then, so the tier's pure parts (orbitkv.vllm_tier.verdicts,
.pagekeys, .config) are usable without it.

Where things are: ``tier`` (vLLM's interface; only moves state between vLLM
and the worker), ``link`` (the worker: every call to the peer, the
deadlines, when a job ends), ``worker`` (the worker in a process of its own,
the default), ``staging`` (zero copy through vLLM's pool
file, or one copy through a staging file), ``verdicts`` (the lookup answer
cache, a pure state machine), ``pagekeys`` (the layout and the page keys;
which engines share pages), ``config`` (the options).
"""

from typing import Any

__all__ = ["OrbitKVTier"]


def __getattr__(name: str) -> Any:
    if name == "OrbitKVTier":
        from orbitkv.vllm_tier.tier import OrbitKVTier

        return OrbitKVTier
    raise AttributeError(name)
