#!/usr/bin/env python3
"""Where an engine's threads spent their CPU, from a py-spy raw profile (scripts/gpu/lib.sh
pyspy_start: every process and thread, samples of running threads only, RATE a second).

  python3 scripts/gpu/pyspy-summary.py FILE [--rate 200] [--top 20] [--threads 3] [--match orbitkv,kv_connector]

Per thread (the THREADS busiest of each process), its samples as seconds of CPU, then its
TOP frames by inclusive time (a frame counted once per stack) and every frame whose text holds
one of MATCH. Two runs of one workload (a connector
against another) compare frame by frame. Standard library only: it runs on the GPU machine.
"""

from __future__ import annotations

import argparse
import collections
import sys


def parse(lines):
    """{(process, thread): [(frames, count)]} from py-spy's raw lines."""
    out = collections.defaultdict(list)
    for line in lines:
        line = line.rstrip("\n")
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        frames = stack.split(";")
        procs = [f for f in frames if f.startswith("process ")]
        threads = [f for f in frames if f.startswith("thread (")]
        code = [f for f in frames if not f.startswith(("process ", "thread ("))]
        proc = procs[-1].split(":", 1)[0] + " " + _short_cmd(procs[-1]) if procs else "process"
        thread = threads[-1] if threads else "thread"
        out[(proc, thread)].append((code, int(n)))
    return out


def _short_cmd(proc_frame: str) -> str:
    cmd = proc_frame.split(":", 1)[1].strip('"') if ":" in proc_frame else ""
    return cmd[:60]


def summarize(stacks, rate: float, top: int, nthreads: int, match: list[str]) -> list[str]:
    lines = []
    by_proc = collections.defaultdict(list)
    for (proc, thread), rows in stacks.items():
        total = sum(n for _, n in rows)
        by_proc[proc].append((total, thread, rows))
    for proc in sorted(by_proc):
        for total, thread, rows in sorted(by_proc[proc], key=lambda t: -t[0])[:nthreads]:
            lines.append(f"{proc} | {thread}: {total / rate:.2f} s running")
            incl = collections.Counter()
            for code, n in rows:
                for f in set(code):
                    incl[f] += n
            for f, n in incl.most_common(top):
                lines.append(f"  {n / rate * 1000:9.1f} ms  {f}")
            hits = [(f, n) for f, n in incl.most_common() if any(m in f for m in match)]
            if hits:
                lines.append("  matching " + ",".join(match) + ":")
                for f, n in hits[:top]:
                    lines.append(f"  {n / rate * 1000:9.1f} ms  {f}")
    return lines


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("file")
    ap.add_argument("--rate", type=float, default=200.0)
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--threads", type=int, default=3)
    ap.add_argument("--match", default="orbitkv,kv_connector")
    a = ap.parse_args(argv)
    with open(a.file) as f:
        stacks = parse(f)
    if not stacks:
        print(f"{a.file}: no samples")
        return 1
    print("\n".join(summarize(stacks, a.rate, a.top, a.threads, [m for m in a.match.split(",") if m])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
