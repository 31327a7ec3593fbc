"""TTFT of one long prompt at a time on vLLM's CPU build, side by side in one run: vLLM
without a connector (native), with a connector that moves nothing (null: vLLM's connector
plumbing alone, orbitkv.bench.nullconn) and with OrbitKV against a fresh `orbitkv serve`.

    python -m orbitkv.bench.vllm_cpu_ttft --peer-bin out/orbitkv [--tokens 8192] [--reps 20]
        [--configs native,null,orbitkv] [--pairs 1] [--model DIR] [--out DIR]

Each config runs in a fresh engine process (and, for OrbitKV, a fresh peer), in the order
given and then reversed (AB/BA) for each pair. Every rep sends a new random prompt three
times, one request at a time, --output-tokens each (16, as the GPU probe): cold (computed),
resident (vLLM's own prefix cache holds it) and evicted (after vLLM's reset_prefix_cache:
OrbitKV restores it from the peer, the others compute it again). Every config gets the same
prompts. A request's time is vLLM's own time to first token (its first_token_latency, from
the request's arrival). The OrbitKV runs record the connector's hooks (orbitkv.hooktrace);
the report adds each phase's mean connector time a request (a request's steps to its end).

This is the CPU side of the 8K probe on the H100 (scripts/gpu/vllm.sh probe), where a
resident prompt was 6-7 ms slower with OrbitKV than native: the ratios and the hook times
say how much of a request's time the connector takes on this machine; the GPU's figures are
its own. Needs vLLM's CPU build (scripts/install-vllm-cpu032.sh)."""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Optional, Sequence

PHASES = ("cold", "resident", "evicted")
CONFIGS = ("native", "null", "orbitkv")
ENGINE_DEADLINE_S = 1800
SERVE_DEADLINE_S = 60


def _default_model() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.path.normpath(os.path.join(here, "..", "..", "..", "models", "qwen3-tiny"))


def prompts(n: int, tokens: int, seed: int = 11) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1000) for _ in range(tokens)] for _ in range(n)]


# --- the engine (a child process: vLLM starts its EngineCore as another process) ----------

def _block_size() -> int:
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    size = CPUAttentionBackend.get_supported_kernel_block_sizes()[0]
    return int(getattr(size, "base", size))


def _kv_transfer(config: str, socket: str) -> Optional[dict]:
    if config == "native":
        return None
    if config == "null":
        return {"kv_connector": "NullConnector", "kv_connector_module_path": "orbitkv.bench.nullconn",
                "kv_role": "kv_both"}
    return {"kv_connector": "OrbitKVConnector", "kv_connector_module_path": "orbitkv.vllm", "kv_role": "kv_both",
            "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {"socket": socket}}


RESET_DEADLINE_S = 30.0


def run_engine(config: str, socket: str, model: str, tokens: int, reps: int, output_tokens: int, out: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kw = {} if config == "native" else {"kv_transfer_config": _kv_transfer(config, socket)}
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
              block_size=_block_size(), max_model_len=tokens + output_tokens + 64, enable_prefix_caching=True, seed=0,
              disable_log_stats=False, **kw)
    sp = SamplingParams(max_tokens=output_tokens, temperature=0.0, ignore_eos=True)

    def timed(p: list[int]) -> dict:
        t0 = time.time()
        s = time.perf_counter()
        o = llm.generate([TokensPrompt(prompt_token_ids=p)], sp, use_tqdm=False)[0]
        wall = (time.perf_counter() - s) * 1000.0
        m = o.metrics
        ttft = getattr(m, "first_token_latency", 0.0) * 1000.0 if m is not None else 0.0
        row = {"ms": ttft or wall, "wall_ms": wall, "t0": t0, "t1": time.time()}
        if m is not None and getattr(m, "scheduled_ts", 0) and getattr(m, "first_token_ts", 0):
            # vLLM's engine-core clock: waiting (for a slot, or for an async load), then
            # from scheduled to the first token (the step(s) that compute it)
            row["queued_ms"] = (m.scheduled_ts - m.queued_ts) * 1000.0
            row["first_step_ms"] = (m.first_token_ts - m.scheduled_ts) * 1000.0
        return row

    def evict() -> int:
        """vLLM's reset_prefix_cache, retried while finished requests still hold
        blocks (a connector's delayed free); returns the attempts it took."""
        deadline = time.monotonic() + RESET_DEADLINE_S
        n = 1
        while llm.reset_prefix_cache() is False:
            if time.monotonic() > deadline:
                raise RuntimeError(f"reset_prefix_cache refused for {RESET_DEADLINE_S:g} s")
            time.sleep(0.01)
            n += 1
        return n

    for p in prompts(2, tokens, seed=99):  # warm-up: not reported
        timed(p)
        timed(p)
        evict()
        timed(p)
    rows = []
    for i, p in enumerate(prompts(reps, tokens)):
        for phase in PHASES:
            resets = evict() if phase == "evicted" else 0
            rows.append({"rep": i, "phase": phase, "resets": resets, **timed(p)})
    with open(out, "w") as f:
        json.dump(rows, f)


# --- the bench (the parent) ------------------------------------------------------------------

def _start_peer(binary: str, tmp: str) -> tuple[subprocess.Popen, str]:
    sock = os.path.join(tmp, "orbitkv.sock")
    log = open(os.path.join(tmp, "peer.log"), "ab")
    proc = subprocess.Popen([binary, "serve", "--data-dir", tmp, "--socket", sock, "--dram-bytes", "1GiB",
                             "--ssd-bytes", "0", "--metrics-addr", "127.0.0.1:0"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    log.close()
    deadline = time.monotonic() + SERVE_DEADLINE_S
    while time.monotonic() < deadline:
        with open(os.path.join(tmp, "peer.log"), "rb") as f:
            if any(json.loads(x).get("message") == "serving" for x in f if x.startswith(b"{")):
                return proc, sock
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    with open(os.path.join(tmp, "peer.log"), "rb") as f:
        raise RuntimeError("orbitkv serve did not start: " + f.read().decode(errors="replace")[-2000:])


def _run(config: str, i: int, args: argparse.Namespace, work: str) -> dict:
    tmp = tempfile.mkdtemp(prefix=f"{config}-{i}-", dir=work)
    env = dict(os.environ, VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"), HF_HUB_OFFLINE="1",
               VLLM_ENABLE_V1_MULTIPROCESSING="1")
    peer, sock = None, ""
    if config == "orbitkv":
        peer, sock = _start_peer(args.peer_bin, tmp)
        if args.hook_trace:
            env["ORBITKV_HOOK_TRACE"] = os.path.join(tmp, "hooks")
    out = os.path.join(tmp, "ttft.json")
    cmd = [sys.executable, "-m", "orbitkv.bench.vllm_cpu_ttft", "--engine", config, "--socket", sock, "--model",
           args.model, "--tokens", str(args.tokens), "--reps", str(args.reps), "--output-tokens",
           str(args.output_tokens), "--result", out]
    try:
        with open(os.path.join(tmp, "engine.log"), "w") as log:
            rc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, timeout=ENGINE_DEADLINE_S).returncode
        if rc != 0:
            with open(os.path.join(tmp, "engine.log")) as log:
                raise RuntimeError(f"engine {config}-{i} exited {rc}:\n" + log.read()[-4000:])
    finally:
        if peer is not None:
            peer.terminate()
            try:
                peer.wait(timeout=30)
            except subprocess.TimeoutExpired:
                peer.kill()
                peer.wait()
    with open(out) as f:
        rows = json.load(f)
    return {"config": config, "run": i, "dir": tmp, "rows": rows, "hooks": _hook_ms(os.path.join(tmp, "hooks"), rows)}


def _hook_ms(directory: str, rows: Sequence[dict]) -> dict[str, float]:
    """Per phase: the connector's hook milliseconds (both halves) a request, from the steps
    that started inside the request's wall-clock window."""
    if not os.path.isdir(directory):
        return {}
    from orbitkv.hooktrace import read_lines

    lines = read_lines(directory)
    out: dict[str, list[float]] = {}
    for r in rows:
        ms = sum(sum(d.get("hooks", {}).values()) for d in lines if r["t0"] <= d["t0"] <= r["t1"])
        out.setdefault(r["phase"], []).append(ms)
    return {ph: statistics.fmean(v) for ph, v in out.items()}


def _pct(v: Sequence[float], q: float) -> float:
    s = sorted(v)
    return s[min(len(s) - 1, int(q * len(s)))]


def report(runs: Sequence[dict]) -> str:
    by: dict[tuple[str, str], list[float]] = {}
    hooks: dict[tuple[str, str], list[float]] = {}
    for r in runs:
        for row in r["rows"]:
            by.setdefault((r["config"], row["phase"]), []).append(row["ms"])
        for ph, ms in r["hooks"].items():
            hooks.setdefault((r["config"], ph), []).append(ms)
    configs = [c for c in CONFIGS if any(k[0] == c for k in by)]
    parts: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for r in runs:
        for row in r["rows"]:
            if "queued_ms" in row:
                parts.setdefault((r["config"], row["phase"]), []).append((row["queued_ms"], row["first_step_ms"]))
    lines = ["config    phase      n   p50 ms   p90 ms  × native p50  queued / to 1st token p50  connector hooks ms/request"]
    for ph in PHASES:
        base = statistics.median(by[("native", ph)]) if ("native", ph) in by else 0.0
        for c in configs:
            v = by.get((c, ph))
            if not v:
                continue
            p50 = statistics.median(v)
            ratio = f"{p50 / base:12.3f}" if base else f"{'':>12}"
            h = hooks.get((c, ph))
            hs = f"{statistics.fmean(h):10.2f}" if h else ""
            q = parts.get((c, ph))
            qs = (f"{statistics.median(x for x, _ in q):10.2f} / {statistics.median(y for _, y in q):8.2f}  " if q
                  else f"{'':>23}  ")
            lines.append(f"{c:9s} {ph:9s} {len(v):3d} {p50:8.2f} {_pct(v, 0.9):8.2f} {ratio}  {qs}{hs}")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m orbitkv.bench.vllm_cpu_ttft", description=__doc__.split("\n\n")[0])
    ap.add_argument("--peer-bin", default=os.environ.get("ORBITKV_BIN", ""), help="the orbitkv binary (OrbitKV runs)")
    ap.add_argument("--configs", default=",".join(CONFIGS))
    ap.add_argument("--pairs", type=int, default=1, help="AB/BA pairs: each pair runs the configs, then reversed")
    ap.add_argument("--tokens", type=int, default=8192)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--output-tokens", type=int, default=16)
    ap.add_argument("--no-hook-trace", dest="hook_trace", action="store_false",
                    help="OrbitKV runs without ORBITKV_HOOK_TRACE (no hook column)")
    ap.add_argument("--model", default=_default_model())
    ap.add_argument("--out", default="", help="keep every run's logs, hook traces and timings here")
    ap.add_argument("--engine", default="", help=argparse.SUPPRESS)  # a child: one engine
    ap.add_argument("--socket", default="", help=argparse.SUPPRESS)
    ap.add_argument("--result", default="", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.engine:
        run_engine(args.engine, args.socket, args.model, args.tokens, args.reps, args.output_tokens, args.result)
        return 0
    configs = [c for c in args.configs.split(",") if c]
    bad = [c for c in configs if c not in CONFIGS]
    if bad:
        ap.error(f"unknown configs {bad}: choose from {', '.join(CONFIGS)}")
    if "orbitkv" in configs and not (args.peer_bin and os.access(args.peer_bin, os.X_OK)):
        ap.error("the orbitkv config needs --peer-bin (or ORBITKV_BIN): the orbitkv binary")
    work = args.out or tempfile.mkdtemp(prefix="vllm-cpu-ttft-")
    os.makedirs(work, exist_ok=True)
    runs = []
    for pair in range(args.pairs):
        for c in configs + configs[::-1]:
            runs.append(_run(c, len([r for r in runs if r["config"] == c]) + 1, args, work))
            print(f"vllm_cpu_ttft: {c} run {runs[-1]['run']} done ({runs[-1]['dir']})", file=sys.stderr, flush=True)
    with open(os.path.join(work, "runs.json"), "w") as f:
        json.dump(runs, f)
    print(f"vLLM CPU build, {args.tokens}-token prompts, {args.output_tokens} output tokens, {args.reps} reps a run, "
          f"{args.pairs} AB/BA pair(s) of {', '.join(configs)}; records in {work}")
    print(report(runs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
