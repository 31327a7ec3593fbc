"""python3 -m orbitkv.refengine --preset tiny --port P --kv-tokens N [...]

Prints `refengine listening on http://127.0.0.1:P` once it serves; SIGINT/SIGTERM shut it
down in order (the KV pool's /dev/shm file is removed).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from .config import engine_config


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m orbitkv.refengine", description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="tiny", help="model preset: tiny | qwen3-8b")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="HTTP port (0 = any free port)")
    p.add_argument("--kv-tokens", type=int, default=16384, help="KV pool capacity, tokens")
    p.add_argument("--block-size", type=int, default=None, help="tokens per engine block (default 16)")
    p.add_argument("--page-tokens", type=int, default=None, help="tokens per OrbitKV page (default 64)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N")
    p.add_argument("--seed", type=int, default=0, help="weight seed")
    p.add_argument("--max-num-seqs", type=int, default=None, help="running requests at most (default 16)")
    p.add_argument("--max-batched-tokens", type=int, default=None, help="tokens per step (default 2048)")
    p.add_argument("--attn-backend", default=None, help="auto | exact | sdpa")
    p.add_argument("--invariant-rows", type=int, default=None,
                   help="exact backend: token tiles of this size for batch invariance on GPUs (default: 64 on CUDA, 0 on CPU)")
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--cuda-graphs", default=None, choices=["auto", "on", "off"],
                   help="decode steps (batch <= 8, padded to 1/2/4/8) as CUDA graph replays; "
                        "auto (default) = on for CUDA with the sdpa backend, off for exact and on CPU")
    p.add_argument("--request-timeout-s", type=float, default=600.0)
    p.add_argument("--connector", default="none", choices=["none", "orbitkv"])
    p.add_argument("--orbitkv-socket", default=None, help="the OrbitKV peer's engine socket")
    p.add_argument("--kv-role", default=None, choices=["kv_producer", "kv_consumer", "kv_both"],
                   help="P/D role of the connector (vLLM's kv_role; default kv_both): orbitkv.vllm.pd")
    p.add_argument("--connector-extra", default=None,
                   help="JSON object merged into kv_connector_extra_config")
    a = p.parse_args(argv)
    if a.connector == "orbitkv" and not a.orbitkv_socket:
        p.error("--connector orbitkv needs --orbitkv-socket PATH")
    return a


def main(argv=None) -> int:
    a = parse_args(argv)
    try:
        cfg = engine_config(
            a.preset, kv_tokens=a.kv_tokens, block_size=a.block_size, page_tokens=a.page_tokens,
            device=a.device, seed=a.seed, max_num_seqs=a.max_num_seqs,
            max_batched_tokens=a.max_batched_tokens, attn_backend=a.attn_backend, invariant_rows=a.invariant_rows,
            cuda_graphs=a.cuda_graphs, enable_prefix_caching=False if a.no_prefix_caching else None)
        extra = json.loads(a.connector_extra) if a.connector_extra else {}
    except ValueError as e:
        print(f"refengine: {e}", file=sys.stderr)
        return 2
    connector = None
    if a.connector == "orbitkv":
        from .connector import load_connector
        extra.setdefault("socket", a.orbitkv_socket)
        if a.kv_role:
            extra["kv_role"] = a.kv_role
        connector = lambda c, pool: load_connector("orbitkv", c, pool, extra)  # noqa: E731
    from .service import Service
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with Service(cfg, connector, a.host, a.port, a.request_timeout_s) as svc:
        print(f"refengine listening on {svc.url}", flush=True)
        while not stop.wait(0.5):
            if not svc.loop.alive():
                print(f"refengine: engine loop failed:\n{svc.loop.error}", file=sys.stderr, flush=True)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
