"""The connector's telemetry in vLLM's own stats pipeline: the scheduler half
hands the restore admission gate's counters (orbitkv.gate.GateStats) to vLLM
(``get_kv_connector_stats``), which aggregates them and prints ``reduce()`` in
its periodic "KV Transfer metrics" log line."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from orbitkv.gate import GateStats

try:  # pragma: no cover - exercised where vLLM is installed
    from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats  # type: ignore
except Exception:

    @dataclasses.dataclass
    class KVConnectorStats:  # type: ignore[no-redef]
        data: dict = dataclasses.field(default_factory=dict)


_SUMS = ("restores", "hold_s", "deferred_restores", "deferred_misses", "deferred_budget", "delayed_frees",
         "early_frees", "flushes")


@dataclasses.dataclass
class OrbitKVStats(KVConnectorStats):
    """``data``: GateStats' fields (sums, and max_holders as a maximum)."""

    @classmethod
    def of(cls, g: GateStats, frees: Optional[dict] = None) -> "OrbitKVStats":
        """The gate's counters, and how finished requests' blocks were freed
        (SchedulerHalf.take_free_stats)."""
        return cls(data={**vars(g), **(frees or {})})  # flat numbers: no deep copy (asdict) every step

    def reset(self) -> None:
        self.data = {}

    def aggregate(self, other: Any) -> "OrbitKVStats":
        od = getattr(other, "data", None) or {}
        for k in _SUMS:
            self.data[k] = self.data.get(k, 0) + od.get(k, 0)
        self.data["max_holders"] = max(self.data.get("max_holders", 0), od.get("max_holders", 0))
        return self

    def reduce(self) -> dict[str, int | float]:
        d = self.data
        n = int(d.get("restores", 0))
        hold = float(d.get("hold_s", 0.0))
        return {
            "orbitkv_restores": n,
            "orbitkv_gate_hold_ms_avg": round(1000 * hold / n, 1) if n else 0.0,
            "orbitkv_gate_deferred_restores": int(d.get("deferred_restores", 0)),
            "orbitkv_gate_deferred_misses": int(d.get("deferred_misses", 0)),
            "orbitkv_gate_deferred_budget": int(d.get("deferred_budget", 0)),
            "orbitkv_gate_max_holders": int(d.get("max_holders", 0)),
            "orbitkv_delayed_frees": int(d.get("delayed_frees", 0)),
            "orbitkv_early_frees": int(d.get("early_frees", 0)),
            "orbitkv_flushes": int(d.get("flushes", 0)),
        }

    def is_empty(self) -> bool:
        d = self.data
        return not any(d.get(k) for k in _SUMS)


def from_data(data: Optional[dict]) -> Optional[OrbitKVStats]:
    return OrbitKVStats(data=dict(data)) if data else None
