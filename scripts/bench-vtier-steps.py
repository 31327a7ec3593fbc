"""bench: how many engine steps an OrbitKVTier promotion takes, idle engine loop against a busy one.

vLLM 0.33's own tiering manager (TieringOffloadingSpec: its CPU primary tier on a /dev/shm pool,
OrbitKVTier as its secondary tier, loaded by module path) and a real peer (`orbitkv serve`, DRAM
only), driven the way vLLM's scheduler drives them (integration/python/tests/vtier_harness.py),
with CPU rows of Qwen3-8B's size (16 tokens x 36 layers x 8 KV heads x 128 x 2 x bf16 = 2.25 MiB).

One engine stores --keys blocks (they cascade to the peer); then, per case, a fresh engine asks
for the same keys a step at a time, as vLLM does for a request whose prefix left its CPU pool: the
tier answers RETRY, probes the peer once per step, then promotes the hits into the engine's pool
(HIT_PENDING) until every key is HIT. Between steps the scheduler either sleeps (idle) or runs
--step-ms of pure Python (busy: vLLM's engine core holds the GIL for most of a step, and the
tier's worker thread needs it between every call to the peer). Printed per case: the steps and
milliseconds until every key was HIT, every promoted row compared with what was stored. The
baseline in the same run: the same request asked again of the engine once the keys are in its
own CPU pool (vLLM's own tier, answered in the step it asks).

Cases: the worker as a thread of the engine's process (option worker "thread") with staging_chunks
64 (the default until 2026-12-06: an 8K-token promotion in 8 parts, a peer round trip each) and 0
(sized by bytes: 1 GiB of rows, 455 of these); then the worker in a process of its own (the default
since), sized by bytes. Measured on the
H100 on 2026-12-06 (docs/journal/2026-12-05-h100-alternatives.md): vLLM's offloading with
OrbitKVTier as its secondary tier lost to vLLM's offloading alone, its lookups taking 88-124 ms
on average and the peer seeing 2,807 completion polls in the run from a worker that polls
once a millisecond while work is in flight. Development machine, 2026-12-06 07:32 UTC, medians of
3 (idle / busy loop): thread, 64 slots 371 / 696 ms; thread, sized by bytes 352 / 512 ms; worker
process 346 / 384 ms (before its pool mapping was populated at start: 639 / 862 ms, a page fault
on the first copy into every 4 KiB of the pool).

  make bench-vtier       (vLLM 0.33's environment: scripts/install-vllm033.sh)
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "integration", "python"))

from vllm.v1.kv_offload.base import LookupResult, ReqContext  # noqa: E402

from tests.fixtures import start_real_peer, stop_real_peer  # noqa: E402
from tests.vtier_harness import END, Engine, keys_for, tier_entry  # noqa: E402

QWEN3_8B_ROW = 16 * 36 * 8 * 128 * 2 * 2
DONE = (LookupResult.HIT, LookupResult.MISS)
# (worker, staging_chunks): the thread in vLLM's process with 64 slots (the default until
# 2026-12-06) and sized by bytes, then the worker process (the default since), sized by bytes
CASES = (("thread", 64), ("thread", 0), ("process", 0))


def busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    n = 0
    while time.perf_counter() < end:
        n += 1


def fill(key: bytes) -> int:
    return key[0] ^ key[1] ^ key[2]


def store_all(e: Engine, keys: list, row: int) -> None:
    m = e.manager
    for i in range(0, len(keys), 16):
        ctx = ReqContext(f"store-{i}")
        with m.lock:
            m.on_new_request(ctx)
            out = m.prepare_store(keys[i:i + 16], ctx)
            if out is not None:
                for k, c in zip(out.keys_to_store, out.store_spec.chunk_ids):
                    e.pool[c] = fill(k)
                m.complete_store(out.keys_to_store, ctx, True)
            m.on_request_finished(ctx)
        e.step()
    e.settle(120)


def ask(e: Engine, keys: list, name: str, step_s: float, loop: str) -> tuple[int, float]:
    """Steps and seconds until every key is HIT; the rows are checked."""
    m, ctx = e.manager, ReqContext(name)
    with m.lock:
        m.on_new_request(ctx)
    t0, steps = time.monotonic(), 0
    while True:
        steps += 1
        with m.lock:
            answers = [m.lookup(k, ctx) for k in keys]
            m.on_schedule_end(END)
        if all(a in DONE for a in answers):
            break
        if time.monotonic() - t0 > 120:
            raise SystemExit(f"{name}: not answered in 120 s: {answers[:4]}")
        busy(step_s) if loop == "busy" else time.sleep(step_s)
    dt = time.monotonic() - t0
    if answers != [LookupResult.HIT] * len(keys):
        raise SystemExit(f"{name}: {sum(a is LookupResult.HIT for a in answers)} of {len(keys)} keys hit")
    with m.lock:
        spec = m.prepare_load(keys, ctx)
        bad = sum(1 for k, c in zip(keys, spec.chunk_ids) if not (e.pool[c] == fill(k)).all())
        m.complete_load(keys, ctx)
        m.on_request_finished(ctx)
    if bad:
        raise SystemExit(f"{name}: {bad} promoted rows differ from what was stored")
    return steps, dt


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--keys", type=int, default=512, help="blocks in the request (512: an 8K-token prefix)")
    ap.add_argument("--row-bytes", type=int, default=QWEN3_8B_ROW)
    ap.add_argument("--step-ms", type=float, default=20.0, help="one engine step")
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    # set 0 warms each engine up (its staging file's pages are touched once, as in a long-lived
    # engine); sets 1..reps are measured, each asked twice: of the tier, then of vLLM's own pool
    sets = [keys_for(40 + i, a.keys) for i in range(a.reps + 1)]
    chunks = (a.reps + 1) * a.keys + 64
    peer_bytes = ((a.reps + 1) * a.keys * a.row_bytes * 5 // 4 + (1 << 28)) >> 20
    with tempfile.TemporaryDirectory(prefix="okv-") as d:
        peer = start_real_peer(d, "--dram-bytes", f"{peer_bytes}MiB", "--ssd-bytes", "0")
        try:
            writer = Engine(tier_entry(peer.socket), chunks=chunks, row=a.row_bytes)
            while not writer.tier._link.ready:
                time.sleep(0.01)
            for ks in sets:
                store_all(writer, ks, a.row_bytes)
            writer.close()
            print(f"{len(sets)} x {a.keys} keys of {a.row_bytes} bytes ({a.keys * a.row_bytes / 2**30:.2f} GiB a "
                  f"request) in the peer; one step = {a.step_ms:g} ms; medians of {a.reps}")
            step_s = a.step_ms / 1000
            for worker, slots in CASES:
                for loop in ("idle", "busy"):
                    e = Engine(tier_entry(peer.socket, staging_chunks=slots, worker=worker), chunks=chunks,
                               row=a.row_bytes)
                    while not e.tier._link.ready:
                        time.sleep(0.01)
                    ask(e, sets[0], f"warm-{worker}-{slots}-{loop}", step_s, loop)
                    got, base = [], []
                    for r, ks in enumerate(sets[1:]):
                        got.append(ask(e, ks, f"tier-{worker}-{slots}-{loop}-{r}", step_s, loop))
                        base.append(ask(e, ks, f"own-{worker}-{slots}-{loop}-{r}", step_s, loop))
                    real_slots = e.tier._link.load_slots
                    e.close()
                    med = lambda xs, i: statistics.median(x[i] for x in xs)  # noqa: E731
                    gbs = a.keys * a.row_bytes / med(got, 1) / 1e9
                    print(f"worker {worker:<7} staging_chunks {slots:>2} ({real_slots} slots), {loop} loop: "
                          f"OrbitKVTier promotion "
                          f"{med(got, 0):.0f} steps, {med(got, 1) * 1000:.0f} ms ({gbs:.2f} GB/s) "
                          f"[{', '.join(f'{s}/{t * 1000:.0f}' for s, t in got)}]; vLLM's own CPU tier "
                          f"{med(base, 0):.0f} steps, {med(base, 1) * 1000:.0f} ms", flush=True)
        finally:
            stop_real_peer(peer)


if __name__ == "__main__":
    main()
