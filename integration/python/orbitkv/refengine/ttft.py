"""python3 -m orbitkv.refengine.ttft --orbitkv-socket S [--preset qwen3-8b --device cuda]

Time to first token of a long prompt whose prefix is restored from an OrbitKV peer's DRAM,
beside the same prompts' recompute TTFT, in one engine with the OrbitKV connector (vLLM's
call sequence; on CUDA the KV pool is registered with the peer by CUDA IPC handle).

Sequence: one warm-up prompt, then (unless `--no-warm-shapes`) the restore's and the local
hit's step shapes once on it; then `--prompts` distinct prompts computed from scratch (the
connector misses, the engine computes and saves their pages to the peer): recompute TTFT;
saves drained; then the same prompts again, in the same order, each after the engine's prefix
cache was emptied (`Engine.reset_prefix_cache`), so its prefix comes back from the peer:
restore TTFT. Last, one prompt twice in a row: the second hits the engine's own prefix cache
(the floor: no copy at all). Each sample records the engine's counters over its request
(`counters`), and the probe fails (`SampleMismatch`) unless a recompute took nothing from the
prefix cache or the peer, a restore took every page it may ask for from the peer and nothing
local, and the floor took every full block but the last token's locally. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from .config import engine_config
from .connector import load_connector
from .engine import Engine


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def _worker(e: Engine):
    return getattr(getattr(e, "connector_worker", None), "worker", None)


# Engine counters each sample records as deltas over its request.
COUNTERS = ("prefix_hit_tokens", "external_matched_tokens", "external_restored_tokens", "load_error_blocks")


class SampleMismatch(RuntimeError):
    """A sample is not what its name says (a "restore" the engine's own cache served, a
    "recompute" the peer restored): the probe fails rather than report a false ratio."""


def check_sample(kind: str, i: int, s: dict, prompt_tokens: int, block_size: int, page_tokens: int) -> None:
    """Raise SampleMismatch unless sample s (its engine counter deltas) is a `kind` sample:
    recompute: nothing from the local prefix cache, nothing claimed by the connector;
    restore: nothing local, every page the connector may ask for ((n - 1) // page_tokens
    pages) restored without a load error; local: every full block of the prompt but the last
    token's from the local prefix cache, nothing from the connector."""
    c = s["counters"]
    local, matched, restored = c["prefix_hit_tokens"], c["external_matched_tokens"], c["external_restored_tokens"]
    name = f"{kind} sample {i}"
    if kind == "recompute":
        if local or matched or restored:
            raise SampleMismatch(
                f"{name} is not a recompute: {local} tokens from the engine's prefix cache, {matched} claimed and "
                f"{restored} restored by the peer. The peer already held this prompt (a previous probe with the same "
                f"--seed against the same peer?): use another --seed or a fresh peer")
        return
    if kind == "restore":
        want = (prompt_tokens - 1) // page_tokens * page_tokens
        if local:
            raise SampleMismatch(f"{name} is not a restore: the engine's own prefix cache served {local} of its tokens")
        if restored != want or c["load_error_blocks"]:
            raise SampleMismatch(
                f"{name} is not a whole restore: {restored} of {want} tokens restored, {c['load_error_blocks']} "
                f"load-error blocks. The peer lost pages since the recompute pass (DRAM too small for --prompts "
                f"prompts?) or failed loads")
        return
    want = (prompt_tokens - 1) // block_size * block_size
    if local != want or matched or restored:
        raise SampleMismatch(f"{name} is not a local prefix hit: {local} of {want} tokens from the engine's prefix "
                             f"cache, {matched} claimed and {restored} restored by the peer")


def _ttft(e: Engine, prompt, device: str) -> dict:
    runner, w = getattr(e, "runner", None), _worker(e)
    timings = getattr(runner, "timings", None)
    lw = getattr(w, "lw_timings", None)
    n0, l0 = len(timings or ()), len(lw or ())
    before = e.stats()
    _sync(device)
    t0 = time.perf_counter()
    req = e.add_request(prompt, 1)
    steps = 0
    while not req.output_token_ids:
        if req.error:
            raise RuntimeError(f"request failed: {req.error}")
        e.step()
        steps += 1
    dt = time.perf_counter() - t0
    after = e.stats()
    out = {"ttft_s": dt, "token": req.output_token_ids[0], "steps": steps,
           "local_hit_tokens": req.num_cached_tokens, "restored_tokens": req.restored_tokens,
           "counters": {k: after[k] - before[k] for k in COUNTERS}}
    if timings is not None:
        # The computing steps' phases (runner.execute); other_s is the rest of the TTFT:
        # scheduling, empty steps, request admission. Layer-wise loads add the Load call's
        # latency (inside start_load_s) and the step end's wait for the results.
        mine = [t for t in timings[n0:] if t["tokens"]]
        b = {k: round(sum(t[k] for t in mine), 5) for k in ("start_load_s", "forward_s", "results_s")}
        b["computing_steps"] = len(mine)
        b["other_s"] = round(dt - sum(b[k] for k in ("start_load_s", "forward_s", "results_s")), 5)
        if mine and "gpu_layer_ready_ms" in mine[-1]:
            b["gpu_layer_ready_ms"] = mine[-1]["gpu_layer_ready_ms"]
        if lw is not None and len(lw) > l0:
            b["layerwise"] = [{k: round(v, 5) if isinstance(v, float) else v for k, v in x.items()} for x in lw[l0:]]
        out["breakdown"] = b
    return out


def _profiled(e: Engine, prompt, device: str):
    """_ttft under torch.profiler: the top operators by CUDA and by CPU time."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        r = _ttft(e, prompt, device)
    ka = prof.key_averages()
    return r, {"by_cuda": ka.table(sort_by="cuda_time_total", row_limit=12),
               "by_cpu": ka.table(sort_by="cpu_time_total", row_limit=12)}


def _drain(e: Engine, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while e.has_work():
        if time.monotonic() > deadline:
            raise TimeoutError("engine did not drain (saves still running?)")
        e.step()
        if e.last_step_tokens == 0:
            time.sleep(0.001)


def run(a: argparse.Namespace) -> dict:
    cfg = engine_config(a.preset, kv_tokens=a.kv_tokens, block_size=a.block_size, page_tokens=a.page_tokens,
                        device=a.device, max_batched_tokens=a.max_batched_tokens)
    extra = {"socket": a.orbitkv_socket, "durability": "dram", "lookup_refresh_s": 0.0,
             "async_load": not a.sync_load, "layerwise": a.layerwise}
    rng = random.Random(a.seed)
    tok = lambda n: [rng.randrange(cfg.model.vocab) for _ in range(n)]  # noqa: E731
    out = {"preset": a.preset, "device": a.device, "prompt_tokens": a.prompt_tokens, "block_size": cfg.block_size,
           "page_tokens": cfg.page_tokens, "kv_tokens": cfg.kv_tokens, "max_batched_tokens": cfg.max_batched_tokens,
           "attn_backend": cfg.resolved_attn_backend, "async_load": extra["async_load"] and not a.layerwise,
           "layerwise_requested": a.layerwise, "warm_shapes": a.warm_shapes,
           "kv_bytes_per_token": cfg.model.kv_bytes_per_token()}
    t0 = time.perf_counter()
    with Engine(cfg, connector=lambda c, pool: load_connector("orbitkv", c, pool, extra)) as e:
        out["startup_s"] = round(time.perf_counter() - t0, 2)
        w = _worker(e)
        out["layerwise"] = bool(getattr(w, "layerwise", False))
        if a.trace and a.device.startswith("cuda") and hasattr(e, "runner"):
            e.runner.trace_layers = True
        warm_prompt = tok(a.prompt_tokens)
        _ttft(e, warm_prompt, a.device)  # warm-up: allocator, kernels, first save
        _drain(e)
        if a.warm_shapes:
            # The restore's and the local hit's step shapes (a page-aligned prefix cached,
            # the rest computed) run once here: a step shape's first run costs 10-20 ms more
            # on CUDA (seen on the H200 in the first restore and in the local hit).
            cut = (a.prompt_tokens - 1) // cfg.page_tokens * cfg.page_tokens
            _ttft(e, warm_prompt[:cut] + tok(a.prompt_tokens - cut), a.device)
            _drain(e)
            _ttft(e, warm_prompt, a.device)
            _drain(e)
        prompts = [tok(a.prompt_tokens) for _ in range(a.prompts)]
        check = lambda kind, i, s: check_sample(kind, i, s, a.prompt_tokens, cfg.block_size, cfg.page_tokens)  # noqa: E731
        # Every recompute and restore sample starts from an empty prefix cache (fresh engine
        # state, whatever --kv-tokens holds), and its engine counters must say it was one.
        cold = []
        for i, p in enumerate(prompts):
            e.reset_prefix_cache()
            cold.append(_ttft(e, p, a.device))
            check("recompute", i, cold[-1])
            _drain(e)
        warm = []
        for i, p in enumerate(prompts):
            e.reset_prefix_cache()
            warm.append(_ttft(e, p, a.device))
            check("restore", i, warm[-1])
            _drain(e)
        floor_prompt = tok(a.prompt_tokens)
        _ttft(e, floor_prompt, a.device)
        _drain(e)
        if a.profile and a.device.startswith("cuda"):
            floor, out["local_hit_profile"] = _profiled(e, floor_prompt, a.device)
        else:
            floor = _ttft(e, floor_prompt, a.device)
        check("local", 0, floor)
        _drain(e)
        out["engine_stats"] = {k: v for k, v in e.stats().items() if isinstance(v, (int, float))}
    rec = [c["ttft_s"] for c in cold]
    res = [w["ttft_s"] for w in warm]
    out["recompute"] = cold
    out["restore"] = warm
    out["local_prefix_hit"] = floor
    out["recompute_ttft_median_s"] = round(statistics.median(rec), 4)
    out["restore_ttft_median_s"] = round(statistics.median(res), 4)
    out["restore_over_recompute"] = round(statistics.median(res) / statistics.median(rec), 4)
    out["local_hit_over_recompute"] = round(floor["ttft_s"] / statistics.median(rec), 4)
    out["restored_bytes_median"] = statistics.median(w["restored_tokens"] for w in warm) * out["kv_bytes_per_token"]
    out["first_tokens_match"] = [c["token"] == w["token"] for c, w in zip(cold, warm)]
    return out


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m orbitkv.refengine.ttft")
    p.add_argument("--orbitkv-socket", required=True)
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--prompts", type=int, default=4, help="distinct prompts (samples of each TTFT)")
    p.add_argument("--kv-tokens", type=int, default=17408, help="engine KV pool, tokens (the prefix cache is emptied before each sample anyway)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--page-tokens", type=int, default=64)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--sync-load", action="store_true", help="load inside the step instead of between steps")
    p.add_argument("--layerwise", action="store_true",
                   help="layer-wise loads: inside the step, each layer's attention waits on the GPU for its layer only")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--profile", action="store_true", help="profile the local-hit step (CUDA)")
    p.add_argument("--no-warm-shapes", dest="warm_shapes", action="store_false",
                   help="skip warming the restore's and the local hit's step shapes before measuring")
    p.add_argument("--trace", action="store_true",
                   help="CUDA: time when the GPU gets past each layer's load wait (timing events per layer)")
    return p.parse_args(argv)


def main(argv=None) -> None:
    print(json.dumps(run(parse_args(argv))), flush=True)


if __name__ == "__main__":
    main()
