"""python3 -m orbitkv.refengine.steps — prefill and decode step times, eager vs CUDA graphs,
beside the hardware floor.

Per backend and batch size b: b fresh prompts of --prompt-tokens tokens are prefilled in one
step, then decode --decode-steps steps (after --warmup steps; graphs are captured at start),
once with decode graphs off and once on, --rounds times (eager, graphs, eager, graphs: the
prefix cache is reset between rounds, so every prefill computes). A step's time is
``Engine.step()`` between two device synchronizations (scheduling and sampling included: what
a client's inter-token latency sees); the table shows medians. The floor of a step is
max(bytes it must read / HBM bandwidth, FLOPs / peak): every weight but the embedding table
plus the K/V of its contexts, and 2 · parameters · tokens. "same out" counts the requests
whose outputs were identical in every round both ways (bf16 sdpa is not batch invariant: the
graph's flash call sees a context bound, not the step's maximum, so a near tie can flip).
On CPU there is no capture: "graphs" is the same fixed-shape decode forward run eagerly (a
smoke test of the path, not a speed figure).

Prints the table, then one JSON object.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from typing import Dict, List

from .bench import _sync
from .config import EngineConfig, ModelConfig, engine_config
from .engine import Engine
from .graphs import DecodeGraphs


def weight_read_bytes(m: ModelConfig) -> int:
    """Bytes of weights one decode step reads: all but the embedding table (a few rows)."""
    return (m.num_params() - m.vocab * m.hidden) * m.dtype_bytes


def floor_ms(m: ModelConfig, tokens: int, context_tokens: int, hbm_tbps: float, tflops: float) -> float:
    """The step's floor: max(weights + the contexts' K/V over HBM bandwidth, matmul FLOPs over peak)."""
    read = weight_read_bytes(m) + context_tokens * m.kv_bytes_per_token()
    flops = 2.0 * (m.num_params() - m.vocab * m.hidden) * tokens
    return 1e3 * max(read / (hbm_tbps * 1e12), flops / (tflops * 1e12))


def _timed_step(e: Engine) -> float:
    _sync(e.cfg.device)
    t0 = time.perf_counter()
    e.step()
    _sync(e.cfg.device)
    return 1e3 * (time.perf_counter() - t0)


def _round(e: Engine, prompts: List[List[int]], graphs: bool, warmup: int, steps: int) -> dict:
    e.runner.use_graphs = graphs
    e.reset_prefix_cache()
    reqs = [e.add_request(p, 1 + warmup + steps) for p in prompts]
    prefill = _timed_step(e)
    if any(not r.output_token_ids for r in reqs):
        raise RuntimeError("the prompts did not fit one prefill step: raise --max-batched-tokens")
    decode = [_timed_step(e) for _ in range(warmup + steps)]
    while e.has_work():
        e.step()
    ctx = sum(len(p) for p in prompts) + len(prompts) * (warmup + steps // 2)  # mid-window contexts
    return {"prefill_ms": prefill, "decode_ms": decode[warmup:], "context_tokens": ctx,
            "tokens": [r.output_token_ids for r in reqs]}


def measure(cfg: EngineConfig, batches: List[int], a: argparse.Namespace) -> List[dict]:
    rows = []
    with Engine(cfg) as e:
        if e.runner.graphs is None:  # CPU: the fixed-shape forward without capture
            e.runner.graphs = DecodeGraphs(cfg, e.model, e.pool, capture=False)
        rng = random.Random(a.seed)
        vocab = cfg.model.vocab
        for b in batches:
            prompts = [[rng.randrange(vocab) for _ in range(a.prompt_tokens)] for _ in range(b)]
            _round(e, prompts, True, a.warmup, 2)  # warm-up: first-use costs of both paths
            _round(e, prompts, False, a.warmup, 2)
            runs: Dict[bool, List[dict]] = {False: [], True: []}
            for _ in range(a.rounds):
                for g in (False, True):
                    runs[g].append(_round(e, prompts, g, a.warmup, a.decode_steps))
            m = cfg.model
            ref = runs[False][0]["tokens"]  # requests whose outputs agree in every round, both ways
            same = sum(all(r["tokens"][i] == ref[i] for r in runs[False] + runs[True]) for i in range(b))
            ctx = runs[False][0]["context_tokens"]
            for step in ("prefill", "decode"):
                key = f"{step}_ms"
                eager = statistics.median(x for r in runs[False] for x in _list(r[key]))
                graph = statistics.median(x for r in runs[True] for x in _list(r[key]))
                fl = (floor_ms(m, b * a.prompt_tokens, b * a.prompt_tokens, a.hbm_tbps, a.tflops) if step == "prefill"
                      else floor_ms(m, b, ctx, a.hbm_tbps, a.tflops))
                rows.append({"backend": cfg.resolved_attn_backend, "batch": b, "step": step,
                             "eager_ms": round(eager, 2), "graphs_ms": round(graph, 2), "floor_ms": round(fl, 2),
                             "eager_over_floor": round(eager / fl, 2), "graphs_over_floor": round(graph / fl, 2),
                             "requests_same": same})
        g = e.runner.graphs
        for r in rows:
            if r["backend"] == cfg.resolved_attn_backend:
                r["graph_stats"] = dict(g.stats, disabled=g.disabled, flash=g.flash)
    return rows


def _list(x):
    return x if isinstance(x, list) else [x]


def table(rows: List[dict]) -> str:
    head = ("backend", "batch", "step", "eager ms", "graphs ms", "floor ms", "eager/floor", "graphs/floor", "same out")
    lines = ["  ".join(f"{h:>12}" for h in head)]
    for r in rows:
        vals = (r["backend"], r["batch"], r["step"], r["eager_ms"], r["graphs_ms"], r["floor_ms"],
                r["eager_over_floor"], r["graphs_over_floor"], f"{r['requests_same']}/{r['batch']}")
        lines.append("  ".join(f"{str(v):>12}" for v in vals))
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python3 -m orbitkv.refengine.steps", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--backends", default="sdpa", help="comma-separated: sdpa, exact")
    p.add_argument("--batches", default="1,8")
    p.add_argument("--prompt-tokens", type=int, default=128)
    p.add_argument("--decode-steps", type=int, default=32, help="timed decode steps per round")
    p.add_argument("--warmup", type=int, default=4, help="decode steps per round before the timed ones")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--kv-tokens", type=int, default=16384)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--hbm-tbps", type=float, default=4.8, help="HBM bandwidth, TB/s (H200: 4.8)")
    p.add_argument("--tflops", type=float, default=989.0, help="dense bf16 peak, TFLOP/s (H200: 989)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    batches = [int(x) for x in a.batches.split(",")]
    rows = []
    for backend in a.backends.split(","):
        cfg = engine_config(a.preset, device=a.device, attn_backend=backend, kv_tokens=a.kv_tokens,
                            block_size=a.block_size, page_tokens=4 * a.block_size,
                            max_batched_tokens=a.max_batched_tokens, max_num_seqs=max(16, max(batches)),
                            cuda_graphs="on")
        rows += measure(cfg, batches, a)
        if a.device.startswith("cuda"):
            import torch
            gc.collect()  # the engine's weights, pool and graphs
            torch.cuda.empty_cache()
    m = engine_config(a.preset).model
    print(f"refengine step times: {m.name} {m.dtype} on {_device_name(a.device)}; weights "
          f"{m.num_params() * m.dtype_bytes / 1e9:.2f} GB ({weight_read_bytes(m) / 1e9:.2f} GB read per decode "
          f"step: all but the embedding table); floor at {a.hbm_tbps:g} TB/s, {a.tflops:g} TFLOP/s; "
          f"{a.prompt_tokens}-token prompts, median of {a.rounds} x {a.decode_steps} decode steps")
    print(table(rows))
    print(json.dumps({"preset": a.preset, "device": _device_name(a.device), "rows": rows}))
    return 0


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch
        return torch.cuda.get_device_name(torch.device(device))
    return "cpu (graphs: the fixed-shape forward, eagerly)"


if __name__ == "__main__":
    sys.exit(main())
