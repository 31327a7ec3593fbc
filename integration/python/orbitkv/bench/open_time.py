"""How long an engine's session open takes when its KV buffer is a large, fresh shared-memory
file (vLLM's CPU cache moved into /dev/shm, SGLang's shm host pool): the time the open call
took, whether it opened on its first attempt, and when the session was ready.

    python -m orbitkv.bench.open_time --socket /path/orbitkv.sock [--gib 4] [--deadline-s 5] [--touched]

The buffer is a sparse /dev/shm file of Qwen3-8B-like layers (36 layers, 8 KV heads of 128,
bf16, 16-token blocks), never touched by this process: the peer's registration is the first
to fault its pages in; with --touched every page is written first (as SGLang's shm allocator
prefaults its host pool), so the peer only maps them. A peer that faults the whole buffer in before answering makes an open
of a few GiB outlast an engine's 5-s open deadline on a machine that first-touches memory at
1 GiB/s; the engine then counts the peer unreachable and opens again."""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from typing import Optional, Sequence

from orbitkv import buffers
from orbitkv.client import Client
from orbitkv.keys import Layout

LAYERS, HEADS, DIM, BLOCK = 36, 8, 128, 16


def run(socket: str, gib: float, deadline_s: float, touched: bool = False, wait_s: float = 60.0) -> dict:
    import torch

    per_block = 2 * BLOCK * HEADS * DIM * 2  # K and V of one layer, bf16
    blocks = int(gib * 2**30 / (LAYERS * per_block))
    fd, path = tempfile.mkstemp(prefix="orbitkv-open-time-", dir="/dev/shm")
    os.close(fd)
    try:
        pool = torch.from_file(path, shared=True, size=LAYERS * per_block * blocks, dtype=torch.uint8)
        if touched:
            pool.view(-1, 4096)[:, 0] = 0  # a write to every page: allocated before the open
        t = pool.view(torch.bfloat16).view(LAYERS, 2, blocks, BLOCK, HEADS, DIM)
        desc = buffers.describe_planes([(t[i, 0], t[i, 1]) for i in range(LAYERS)])
        lay = Layout(model="orbitkv/open-time", revision="r0", dtype="bf16", num_layers=LAYERS, kv_heads=HEADS,
                     head_dim=DIM, tp_size=1, tp_rank=0, page_tokens=64, byte_layout="vllm-flash")
        client = Client(socket, timeout=deadline_s, connect_timeout=deadline_s, lazy=True)
        try:
            start = time.perf_counter()
            s = client.open_session(lay, block_tokens=BLOCK, num_blocks=desc.num_blocks, buffers=desc.buffers,
                                    segments=desc.segments, engine_id="open-time", lazy=True)
            call_s = time.perf_counter() - start
            first = s.ready
            while not s.ready and time.perf_counter() - start < wait_s:
                time.sleep(0.05)
            ready_s = time.perf_counter() - start if s.ready else None
            s.close()
        finally:
            client.close()
    finally:
        os.unlink(path)
    return {"gib": LAYERS * per_block * blocks / 2**30, "open_call_s": call_s, "first_attempt": first, "ready_s": ready_s,
            "touched": touched}


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orbitkv.bench.open_time", description=__doc__.split("\n\n")[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--deadline-s", type=float, default=5.0, help="the open's deadline (the connectors' default: 5 s)")
    ap.add_argument("--touched", action="store_true", help="write every page before the open (SGLang's prefaulted pool)")
    args = ap.parse_args(argv)
    r = run(args.socket, args.gib, args.deadline_s, args.touched)
    ready = f"{r['ready_s']:.2f} s" if r["ready_s"] is not None else "not within 60 s"
    print(f"{'touched' if r['touched'] else 'fresh'} {r['gib']:.2f} GiB /dev/shm buffer: open call {r['open_call_s']:.2f} s "
          f"(deadline {args.deadline_s:g} s), opened on the first attempt: {r['first_attempt']}, ready after {ready}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
