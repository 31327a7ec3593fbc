"""Where a request's time goes inside the vLLM connector (orbitkv.vllm), step by step.

With ORBITKV_HOOK_TRACE=DIR in vLLM's environment, each half of the
connector appends one JSON line per engine step to
DIR/hooks-<side>-<pid>.jsonl: the wall clock at the step's first hook and at
its end, the milliseconds spent in each connector hook during the step, and
what the step did per request (the scheduler: lookups with the tokens they
offered, the loads and saves it planned, the requests it scheduled and how
many tokens; the worker: loads and saves started, loads reported done). Wall
clocks line up across the engine's processes and with the bench's requests.
Off by default: no file, no timing. Lines are buffered: a thread writes
them out every FLUSH_S, and the connector's shutdown (or the process's exit)
the rest.

    python -m orbitkv.hooktrace DIR     per hook: calls, total and max ms; per
                                        request kind (restored, resident, miss),
                                        lookup to its next step; one resident
                                        request's steps; each restore's timeline

The 8K probe on an H100 (2026-12-06) found a resident prompt 6 ms slower
with the connector than without and an evicted one 10 ms slower than vLLM's
own offloading, while the peer's Load took 29 ms of the 71: this says which
step and which hook hold the rest.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import glob
import json
import os
import sys
import threading
import time
from typing import Any, Iterator, Optional, Sequence

ENV = "ORBITKV_HOOK_TRACE"
FLUSH_S = 1.0  # a step's line reaches the file within about this long


class HookTrace:
    """One half's per-step record (side: "scheduler" or "worker")."""

    def __init__(self, side: str, directory: Optional[str] = None) -> None:
        self.side = side
        directory = os.environ.get(ENV, "") if directory is None else directory
        self.path = os.path.join(directory, f"hooks-{side}-{os.getpid()}.jsonl") if directory else ""
        self._file: Optional[Any] = None  # opened at the first line, kept open
        self._lock = threading.Lock()  # the file: the step's thread writes, the flusher flushes
        self._stop = threading.Event()
        if self.path:
            os.makedirs(directory, exist_ok=True)
        self._reset()

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def _reset(self) -> None:
        self._t0: Optional[float] = None
        self._ms: dict[str, float] = collections.defaultdict(float)
        self._notes: dict[str, Any] = {}

    @contextlib.contextmanager
    def hook(self, name: str) -> Iterator[None]:
        if not self.path:
            yield
            return
        if self._t0 is None:
            self._t0 = time.time()
        start = time.perf_counter()
        try:
            yield
        finally:
            self._ms[name] += (time.perf_counter() - start) * 1000.0

    def note(self, key: str, value: Any) -> None:
        """Adds value to the step's list under key."""
        if self.path:
            self._notes.setdefault(key, []).append(value)

    def end_step(self) -> None:
        """Writes the step's line (when any hook ran) and starts the next."""
        if not self.path or self._t0 is None:
            self._reset()
            return
        line = {"side": self.side, "t0": round(self._t0, 6), "t1": round(time.time(), 6),
                "hooks": {k: round(v, 3) for k, v in self._ms.items()}, **self._notes}
        self._reset()
        # One open file, buffered, flushed by a thread once a second and at close (and
        # exit): opening the file for every step's line cost the engine's step more than
        # the hooks it timed.
        text = json.dumps(line) + "\n"
        try:
            with self._lock:
                if self._file is None:
                    self._file = open(self.path, "a", buffering=1 << 16)
                    self._stop.clear()
                    threading.Thread(target=self._flusher, name="orbitkv-hooktrace", daemon=True).start()
                    atexit.register(self.close)
                self._file.write(text)
        except OSError:
            self.path = ""  # a trace that cannot be written stops; the engine goes on

    def _flusher(self) -> None:
        while not self._stop.wait(FLUSH_S):
            self.flush()

    def flush(self) -> None:
        with self._lock:
            if self._file is not None:
                try:
                    self._file.flush()
                except OSError:
                    pass

    def close(self) -> None:
        """Writes out what is buffered and stops the flusher (also at exit)."""
        self._stop.set()
        with self._lock:
            f, self._file = self._file, None
        if f is not None:
            try:
                f.close()
            except OSError:
                pass


def read_lines(directory: str) -> list[dict]:
    out = []
    for p in sorted(glob.glob(os.path.join(directory, "hooks-*.jsonl"))):
        with open(p) as f:
            out.extend(json.loads(line) for line in f if line.strip())
    out.sort(key=lambda d: d["t0"])
    return out


def hook_totals(lines: Sequence[dict]) -> dict[str, dict[str, float]]:
    """Per side.hook: calls (steps it ran in), total and max milliseconds."""
    agg: dict[str, dict[str, float]] = {}
    for d in lines:
        for name, ms in d.get("hooks", {}).items():
            a = agg.setdefault(f"{d['side']}.{name}", {"steps": 0, "total_ms": 0.0, "max_ms": 0.0})
            a["steps"] += 1
            a["total_ms"] += ms
            a["max_ms"] = max(a["max_ms"], ms)
    return agg


def timelines(lines: Sequence[dict]) -> dict[str, list[tuple[float, str]]]:
    """Per request that a lookup offered tokens to: (wall time, event) from
    its first lookup on, in order (offset in ms from that lookup)."""
    first: dict[str, float] = {}
    events: dict[str, list[tuple[float, str]]] = collections.defaultdict(list)
    for d in lines:
        for lk in d.get("lookups", []):
            if lk.get("tokens", 0) > 0:
                first.setdefault(lk["req"], d["t0"])
    for d in lines:
        for key in ("lookups", "loads", "saves", "scheduled", "load_start", "load_done", "recving"):
            for v in d.get(key, []):
                req = v["req"] if isinstance(v, dict) else v
                if req in first:
                    what = f"{d['side']} {key}" + (f" {json.dumps({k: x for k, x in v.items() if k != 'req'})}"
                                                   if isinstance(v, dict) else "")
                    events[req].append((round((d["t1"] - first[req]) * 1000.0, 2), what))
    return dict(events)


def _kind(lk: dict) -> str:
    if lk.get("tokens", 0) > 0:
        return "restored"
    return "resident" if lk.get("computed", 0) > 0 else "miss"


def request_steps(lines: Sequence[dict]) -> dict[str, tuple[str, float, float]]:
    """Per looked-up request: (kind, its first lookup step's start, the start of
    the scheduler step after its first scheduled one — when vLLM has its
    first token). kind: restored (the lookup offered tokens), resident (the
    engine held a prefix, nothing offered), miss."""
    first: dict[str, tuple[str, float]] = {}
    sched: dict[str, list[float]] = collections.defaultdict(list)
    for d in lines:
        if d["side"] != "scheduler":
            continue
        for lk in d.get("lookups", []):
            if lk["req"] not in first:
                first[lk["req"]] = (_kind(lk), d["t0"])
        for v in d.get("scheduled", []):
            if v["req"] in first:
                sched[v["req"]].append(d["t0"])
    return {r: (k, t, sched[r][1]) for r, (k, t) in first.items() if len(sched[r]) > 1}


def kind_summary(lines: Sequence[dict]) -> dict[str, list[float]]:
    """Per kind: milliseconds from each request's lookup step to its first token's step."""
    out: dict[str, list[float]] = collections.defaultdict(list)
    for kind, t0, t_first in request_steps(lines).values():
        out[kind].append((t_first - t0) * 1000.0)
    return dict(out)


def step_window(lines: Sequence[dict], req: str) -> list[tuple[float, float, str, dict]]:
    """The steps (both sides) from req's lookup step to its first token's step:
    (start offset ms, duration ms, side, hooks over 0.05 ms)."""
    kind, t0, t_first = request_steps(lines)[req]
    return [(round((d["t0"] - t0) * 1000.0, 2), round((d["t1"] - d["t0"]) * 1000.0, 2), d["side"],
             {k: v for k, v in d.get("hooks", {}).items() if v > 0.05})
            for d in lines if t0 <= d["t0"] <= t_first]


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        print("usage: python -m orbitkv.hooktrace DIR", file=sys.stderr)
        return 2
    lines = read_lines(args[0])
    if not lines:
        print(f"hooktrace: no hooks-*.jsonl lines under {args[0]}", file=sys.stderr)
        return 1
    print(f"{len(lines)} steps")
    for name, a in sorted(hook_totals(lines).items(), key=lambda kv: -kv[1]["total_ms"]):
        print(f"  {name:45s} steps {int(a['steps']):6d}  total {a['total_ms']:9.1f} ms  max {a['max_ms']:7.2f} ms")
    kinds = kind_summary(lines)
    for kind in ("restored", "resident", "miss"):
        v = sorted(kinds.get(kind, []))
        if v:
            print(f"{kind:9s} requests {len(v):4d}: lookup step to the next step scheduling it (its first token's, "
                  f"unless its prefill is chunked) p50 {v[len(v) // 2]:8.2f} ms, min {v[0]:8.2f}, max {v[-1]:8.2f}")
    resident = [r for r, (k, _, _) in request_steps(lines).items() if k == "resident"]
    if resident:  # where a request that restores nothing spends its time to the first token
        print(f"resident request {resident[-1]}, its steps (start, duration ms, side, hooks over 0.05 ms):")
        for start, dur, side, hooks in step_window(lines, resident[-1]):
            print(f"  +{start:8.2f} {dur:7.2f} {side:9s} {json.dumps(hooks)}")
    for req, evs in timelines(lines).items():
        print(f"request {req}:")
        scheduled = 0
        for ms, what in evs:
            print(f"  +{ms:8.2f} ms  {what}")
            scheduled += what.startswith("scheduler scheduled")
            if scheduled == 2:  # the decode steps after it say nothing of the restore
                break
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
