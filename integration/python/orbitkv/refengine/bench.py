"""python3 -m orbitkv.refengine.bench — the engine's own speed: prefill, decode, cached TTFT.

Prints one JSON object: prefill tokens/s (one long prompt, chunked by max_batched_tokens),
decode tokens/s (`batch` requests decoding together, after a warm-up decode of the same shape:
CUDA decode graphs are captured then), and time to first token of a prompt
computed from scratch vs the same prompt again with its prefix in the local prefix cache
(the floor any restore can reach: zero copy time).
"""

from __future__ import annotations

import argparse
import json
import random
import time

from .config import engine_config
from .engine import Engine


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        import torch
        torch.cuda.synchronize()


def _ttft(e: Engine, prompt, device: str):
    """(seconds to the first token, that token)"""
    _sync(device)
    t0 = time.perf_counter()
    req = e.add_request(prompt, 1)
    while not req.output_token_ids:
        e.step()
    dt = time.perf_counter() - t0
    while e.has_work():
        e.step()
    return dt, req.output_token_ids[0]


def run(a: argparse.Namespace) -> dict:
    cfg = engine_config(a.preset, kv_tokens=a.kv_tokens, block_size=a.block_size, page_tokens=a.page_tokens,
                        device=a.device, max_batched_tokens=a.max_batched_tokens, max_num_seqs=max(16, a.batch),
                        cuda_graphs=a.cuda_graphs)
    rng = random.Random(0)
    vocab = cfg.model.vocab
    tok = lambda n: [rng.randrange(vocab) for _ in range(n)]  # noqa: E731
    out = {"preset": a.preset, "device": a.device, "block_size": cfg.block_size,
           "attn_backend": cfg.resolved_attn_backend, "max_batched_tokens": cfg.max_batched_tokens,
           "cuda_graphs": cfg.resolved_cuda_graphs}
    t0 = time.perf_counter()
    with Engine(cfg) as e:
        out["startup_s"] = round(time.perf_counter() - t0, 3)
        _ttft(e, tok(64), a.device)  # warm-up
        cold = [_ttft(e, tok(a.prompt_tokens), a.device)[0] for _ in range(a.repeat)]
        prompt = tok(a.prompt_tokens)
        _, first = _ttft(e, prompt, a.device)
        hot = [_ttft(e, prompt, a.device) for _ in range(a.repeat)]
        out["prompt_tokens"] = a.prompt_tokens
        out["ttft_recompute_s"] = round(min(cold), 4)
        out["ttft_prefix_cached_s"] = round(min(t for t, _ in hot), 4)
        out["prefix_cached_token_matches"] = all(tok_ == first for _, tok_ in hot)
        out["prefill_tokens_per_s"] = round(a.prompt_tokens / min(cold), 1)
        # warm-up decode of the same shape: decode graphs are captured on first use (one per
        # batch size and context bucket), which the timed decode below must not include
        e.generate([tok(a.decode_prompt_tokens) for _ in range(a.batch)], a.decode_tokens + 1)
        reqs = [e.add_request(tok(a.decode_prompt_tokens), a.decode_tokens + 1) for _ in range(a.batch)]
        while any(not r.output_token_ids for r in reqs):
            e.step()
        _sync(a.device)
        t1, before = time.perf_counter(), sum(r.num_output_tokens for r in reqs)
        while e.has_work():
            e.step()
        dt = time.perf_counter() - t1
        out["decode_batch"] = a.batch
        out["decode_tokens_per_s"] = round((sum(r.num_output_tokens for r in reqs) - before) / dt, 1)
        out["decode_step_ms"] = round(1000 * dt / a.decode_tokens, 2)
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(prog="python3 -m orbitkv.refengine.bench")
    p.add_argument("--preset", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--kv-tokens", type=int, default=16384)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--page-tokens", type=int, default=64)
    p.add_argument("--max-batched-tokens", type=int, default=2048)
    p.add_argument("--prompt-tokens", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--decode-prompt-tokens", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--cuda-graphs", default=None, choices=["auto", "on", "off"], help="decode graphs (default auto)")
    print(json.dumps(run(p.parse_args(argv))))


if __name__ == "__main__":
    main()
