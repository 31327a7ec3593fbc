"""The tier's configuration: the keys of its entry in ``secondary_tiers``.

vLLM's tiering spec passes every key of a secondary tier's entry (but
``type``, ``module_path`` and ``backpressure``) to the tier's constructor;
``TierConfig.from_options`` takes them, refuses unknown ones and validates.

Keys (all optional except ``socket``, which may come from $ORBITKV_SOCKET):
  socket              the host peer's engine socket (Unix path)
  rpc_timeout_s       deadline of every call to the peer: a lookup, a save or
                      load submission, one completion poll (default 1.0 s)
  connect_timeout_s   how long the session open waits for a peer that accepted
                      the connection but has not answered (default 1.0 s); a
                      peer that is down refuses at once and the session opens
                      itself in the background once it is up
  store_deadline_ms   the peer's deadline for one store job (default 10000 ms)
  load_deadline_ms    the peer's deadline for one load job (default 5000 ms)
  abandon_grace_s     how long past its deadline a job whose outcome is unknown
                      (a peer that stopped answering) keeps its CPU slots before
                      it is reported failed (default 2.0 s; see doc.py, "slots")
  durability          "dram" (default): a store is done once the page is in the
                      peer's DRAM; "ssd": once it is on the peer's SSD too
  zero_copy           "auto" (default): stores are read by the peer straight
                      from vLLM's CPU pool file when it can open it (else
                      staged), loads land in a staging region and are copied
                      into the pool (one copy; see link.py, "Slots", for why);
                      "on": loads land in the pool too (refuses to start
                      without the pool file); "off": both staged
  staging_dir         where the staging region's file goes (default /dev/shm;
                      it must be a directory the peer can open files in)
  staging_chunks      staging slots, the most chunks in flight through it
                      (default 0: as many as 1 GiB holds, at least 64, at most
                      the pool's rows; a promotion larger than the slots goes
                      in parts, a peer round trip each)
  request_level       true (default): while stores are zero copy, vLLM also
                      stores to the tier the chunks of each request its CPU pool
                      holds already, so the peer sees its hot prefixes used and
                      keeps them (tier.py, on_new_request); false, or with
                      staged stores: only chunks vLLM computed
  worker              "auto" (default): the worker that talks to the peer runs in
                      a child process of its own when vLLM's pool is a shared
                      file it can map (worker.py: vLLM's engine loop holds the
                      GIL most of a step, and a thread in its process waits for
                      it between every call), else as a thread; "process":
                      refuses to start without the pool file; "thread": in
                      vLLM's process
  lookup_refresh_s    how long a cached "not in the peer" answer is trusted for
                      one request before the peer is asked again (default 0.5 s)
  max_keys_per_lookup keys per lookup call (default 256)
  revision            model revision, part of the layout fingerprint (default "")
  engine_id           the session's engine label at the peer (default
                      "vllm-tier-<vLLM engine id>")
  locality            "LOCAL" (default) or "REMOTE": vLLM's tier filter label
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping

ZERO_COPY_MODES = ("auto", "on", "off")
DURABILITIES = ("dram", "ssd")
LOCALITIES = ("LOCAL", "REMOTE")
WORKERS = ("auto", "process", "thread")


def _flag(name: str, v: Any) -> bool:
    """A JSON true/false, or its spelling as a string."""
    if isinstance(v, bool):
        return v
    if isinstance(v, str) and v.strip().lower() in ("true", "false"):
        return v.strip().lower() == "true"
    raise ValueError(f"orbitkv tier: {name} must be true or false, got {v!r}")


@dataclasses.dataclass(frozen=True)
class TierConfig:
    socket: str
    rpc_timeout_s: float = 1.0
    connect_timeout_s: float = 1.0
    store_deadline_ms: int = 10000
    load_deadline_ms: int = 5000
    abandon_grace_s: float = 2.0
    durability: str = "dram"
    zero_copy: str = "auto"
    staging_dir: str = "/dev/shm"
    staging_chunks: int = 0
    request_level: bool = True
    worker: str = "auto"
    lookup_refresh_s: float = 0.5
    max_keys_per_lookup: int = 256
    revision: str = ""
    engine_id: str = ""
    locality: str = "LOCAL"

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> "TierConfig":
        """From a ``secondary_tiers`` entry's remaining keys; ValueError on
        an unknown key or a bad value."""
        names = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - set(names))
        if unknown:
            raise ValueError(f"orbitkv tier: unknown option(s) {unknown}; known: {sorted(names)}")
        values: dict[str, Any] = {}
        for k, v in options.items():
            if v is None:
                continue
            kind = type(names[k].default) if k != "socket" else str
            if k == "zero_copy" and isinstance(v, bool):
                v = "on" if v else "off"
            if kind is bool:
                v = _flag(k, v)
            values[k] = kind(v)
        values.setdefault("socket", os.environ.get("ORBITKV_SOCKET", ""))
        cfg = cls(**values)
        cfg.validate()
        return cfg

    def validate(self) -> None:
        if not self.socket:
            raise ValueError("orbitkv tier: 'socket' (the peer's engine socket) is required, or set $ORBITKV_SOCKET")
        if self.zero_copy not in ZERO_COPY_MODES:
            raise ValueError(f"orbitkv tier: zero_copy must be one of {ZERO_COPY_MODES}, got {self.zero_copy!r}")
        if self.durability not in DURABILITIES:
            raise ValueError(f"orbitkv tier: durability must be one of {DURABILITIES}, got {self.durability!r}")
        if self.worker not in WORKERS:
            raise ValueError(f"orbitkv tier: worker must be one of {WORKERS}, got {self.worker!r}")
        if self.locality not in LOCALITIES:
            raise ValueError(f"orbitkv tier: locality must be one of {LOCALITIES}, got {self.locality!r}")
        for name in ("rpc_timeout_s", "connect_timeout_s"):
            if getattr(self, name) <= 0:
                raise ValueError(f"orbitkv tier: {name} must be > 0")
        for name in ("store_deadline_ms", "load_deadline_ms", "max_keys_per_lookup"):
            if getattr(self, name) <= 0:
                raise ValueError(f"orbitkv tier: {name} must be > 0")
        if self.staging_chunks < 0:
            raise ValueError("orbitkv tier: staging_chunks must be >= 0 (0: sized by the tier)")
        if self.abandon_grace_s < 0 or self.lookup_refresh_s < 0:
            raise ValueError("orbitkv tier: abandon_grace_s and lookup_refresh_s must be >= 0")
