"""python3 -m orbitkv.refengine.pdprobe --producer URL --consumer URL [--prompt-tokens 8192 ...]

The P/D handoff latency, measured the way a P/D proxy sees it: one prefill engine
(``kv_producer``) and one decode engine (``kv_consumer``) behind OpenAI-compatible
``/v1/completions`` endpoints (the reference engine, or vLLM with the OrbitKV connector),
both on peers that share a catalog (on one host: the same peer). Standard library only.

Per repetition, with fresh random prompts of ``--prompt-tokens`` tokens:

1. handoff: prompt A to the producer, non-streaming, ``max_tokens`` 1 and
   ``kv_transfer_params: {"do_remote_decode": true, ...}`` (what vLLM's P/D proxies send);
   ``prefill_s`` = from sending it to having its response, which carries the handoff params.
   At once the same prompt A goes to the consumer, streaming, with those params:
   **``handoff_s`` = from the moment the router has the producer's response to the consumer's
   first token at the router** — it holds the HTTP hop, the consumer's wait for the
   producer's pages to be visible (``pd_wait_ms`` polls), the lookup, the load of the pages
   into the consumer's KV cache, the compute of the tokens past the last whole page and the
   first token's sampling and streaming. ``pd_ttft_s`` = ``prefill_s`` + ``handoff_s``: the
   P/D TTFT a client behind the proxy sees.
2. recompute: a different prompt B of the same length to the consumer, streaming, no params:
   ``recompute_s`` = its TTFT (nothing of B is in any peer: the consumer computes it all).

One warm-up repetition (not counted) runs first. Each sample records what the consumer says
it restored (``usage.orbitkv_restored_tokens`` on the reference engine, else
``usage.prompt_tokens_details.cached_tokens``, else the delta of vLLM's
``vllm:external_prefix_cache_hits_total``) and, with ``--consumer-metrics``, the deltas of
the consumer's counters over its request. ``--strict`` fails (exit 1) unless every handoff
restored every page the producer promised (``orbitkv_pages`` × ``orbitkv_page_tokens``, at most
the prompt but its last token: promised_tokens) and no
recompute restored anything; ``--expect-match`` also unless the consumer's first token equals
the producer's (true in the CPU reference engine's exact mode; bf16 on a GPU may round
differently). Prints a table; ``--json PATH`` writes every sample and the medians.
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import statistics
import sys
import time
import urllib.parse
from typing import Any, Dict, List, Optional

# What a P/D proxy sends to the prefill engine (vLLM's toy_proxy_server.py).
PREFILL_PARAMS = {"do_remote_decode": True, "do_remote_prefill": False, "remote_engine_id": None,
                  "remote_block_ids": None, "remote_host": None, "remote_port": None}


class ProbeError(RuntimeError):
    """A request failed, or a sample is not what its name says (under --strict)."""


class Endpoint:
    """One OpenAI-compatible server: completions, streamed or not, and its metrics."""

    def __init__(self, url: str, model: Optional[str], timeout_s: float, metrics_url: Optional[str] = None):
        u = urllib.parse.urlsplit(url.rstrip("/"))
        self.host, self.port = u.hostname or "127.0.0.1", u.port or 80
        self.model, self.timeout_s, self.metrics_url = model, timeout_s, metrics_url
        self.url = url

    def _body(self, prompt: List[int], max_tokens: int, stream: bool, params: Optional[dict]) -> bytes:
        body: Dict[str, Any] = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": stream,
                                "return_token_ids": True, "ignore_eos": True}
        if stream:
            body["stream_options"] = {"include_usage": True}
        if self.model:
            body["model"] = self.model
        if params is not None:
            body["kv_transfer_params"] = params
        return json.dumps(body).encode()

    def _post(self, body: bytes) -> http.client.HTTPResponse:
        c = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        if r.status != 200:
            raise ProbeError(f"{self.url}: HTTP {r.status}: {r.read(2000).decode(errors='replace')}")
        return r

    def complete(self, prompt: List[int], max_tokens: int, params: Optional[dict]) -> dict:
        """A non-streaming completion: {tokens, usage, params, took_s}."""
        t0 = time.perf_counter()
        out = json.loads(self._post(self._body(prompt, max_tokens, False, params)).read())
        took = time.perf_counter() - t0
        ch = (out.get("choices") or [{}])[0]
        return {"tokens": list(ch.get("token_ids") or []), "usage": out.get("usage") or {},
                "params": out.get("kv_transfer_params"), "took_s": took, "done_at": t0 + took}

    def stream(self, prompt: List[int], max_tokens: int, params: Optional[dict]) -> dict:
        """A streamed completion: {ttft_s, first_at, tokens, usage, took_s}; ttft_s from
        the moment the request is sent to the first chunk carrying a token."""
        t0 = time.perf_counter()
        r = self._post(self._body(prompt, max_tokens, True, params))
        res: Dict[str, Any] = {"sent_at": t0, "first_at": None, "tokens": [], "usage": {}}
        for raw in r:
            line = raw.strip()
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":
                break
            ev = json.loads(data)
            if ev.get("error"):
                raise ProbeError(f"{self.url}: error in stream: {ev['error']}")
            if ev.get("usage"):
                res["usage"] = ev["usage"]
            ch = (ev.get("choices") or [{}])[0]
            ids = ch.get("token_ids") or []
            if ids and res["first_at"] is None:
                res["first_at"] = time.perf_counter()
            res["tokens"] += ids
        if res["first_at"] is None:
            raise ProbeError(f"{self.url}: the stream ended without a token")
        res["ttft_s"] = res["first_at"] - t0
        res["took_s"] = time.perf_counter() - t0
        return res

    def counters(self) -> Dict[str, float]:
        """The server's Prometheus counters and gauges ({} without --*-metrics)."""
        if not self.metrics_url:
            return {}
        u = urllib.parse.urlsplit(self.metrics_url)
        c = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=10)
        c.request("GET", u.path or "/metrics")
        text = c.getresponse().read().decode(errors="replace")
        out = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, _, v = line.rpartition(" ")
                try:
                    out[name] = float(v)
                except ValueError:
                    pass
        return out


# Consumer counters worth a delta per sample (the reference engine's, vLLM's, the peer's).
WATCH = ("orbitkv_refengine_external_restored_tokens_total", "orbitkv_refengine_computed_prompt_tokens_total",
         "orbitkv_refengine_prefix_cache_hit_tokens_total", "orbitkv_refengine_load_error_blocks_total",
         "orbitkv_refengine_idle_step_seconds_total", "vllm:external_prefix_cache_hits_total",
         "vllm:prefix_cache_hits_total", "vllm:prompt_tokens_total")


def _delta(before: Dict[str, float], after: Dict[str, float]) -> Dict[str, float]:
    out = {}
    for name, v in after.items():
        base = name.split("{", 1)[0]
        if base in WATCH:
            out[name] = round(v - before.get(name, 0.0), 6)
    return out


def restored_tokens(usage: dict) -> Optional[int]:
    """What a server says came from elsewhere than its own compute: the reference engine's
    usage.orbitkv_restored_tokens, else vLLM's prompt_tokens_details.cached_tokens (local
    prefix hits included; vLLM serves it with --enable-prompt-tokens-details), else None."""
    if "orbitkv_restored_tokens" in usage:
        return int(usage["orbitkv_restored_tokens"])
    d = usage.get("prompt_tokens_details") or {}
    return int(d["cached_tokens"]) if d.get("cached_tokens") is not None else None


def restored(usage: dict, counters: Dict[str, float]) -> Optional[int]:
    """restored_tokens from the usage, else the consumer's external-cache counter delta
    (vLLM: vllm:external_prefix_cache_hits_total), else None (not known)."""
    r = restored_tokens(usage)
    if r is None:
        hits = [v for k, v in counters.items() if k.split("{", 1)[0] == "vllm:external_prefix_cache_hits_total"]
        r = int(sum(hits)) if hits else None
    return r


def promised_tokens(params: Optional[dict], prompt_tokens: int) -> int:
    """Tokens the consumer should restore: the pages the producer's kv_transfer_params promise
    (orbitkv_pages) times the page's tokens. A producer that hands over the whole prompt
    (its params name orbitkv_tail_tokens, docs/pd.md: its partial last page is one of the
    pages) promises all of it but the last token, which the engine computes again; an
    earlier one at most the pages before the prompt's last token ((n - 1) // page_tokens)."""
    if not params:
        return 0
    pt = int(params.get("orbitkv_page_tokens") or 0)
    if pt <= 0:
        return 0
    pages = int(params.get("orbitkv_pages") or 0)
    if "orbitkv_tail_tokens" in params:
        return max(0, min(pages * pt, prompt_tokens - 1))
    return min(pages, (prompt_tokens - 1) // pt) * pt


def handoff(prod: Endpoint, cons: Endpoint, prompt: List[int], decode_tokens: int) -> dict:
    """One P/D handoff: prefill on the producer, decode on the consumer with its params."""
    p = prod.complete(prompt, 1, dict(PREFILL_PARAMS))
    params = p["params"]
    if not isinstance(params, dict) or not params.get("do_remote_prefill"):
        raise ProbeError(f"the producer returned no handoff kv_transfer_params ({params!r}): is it a "
                         "kv_producer (or kv_both) with the OrbitKV connector?")
    before = cons.counters()
    c = cons.stream(prompt, decode_tokens, params)
    counters = _delta(before, cons.counters())
    return {"prefill_s": p["took_s"], "handoff_s": c["first_at"] - p["done_at"],
            "pd_ttft_s": c["first_at"] - p["done_at"] + p["took_s"], "consumer_ttft_s": c["ttft_s"],
            "producer_token": (p["tokens"] or [None])[0], "consumer_token": c["tokens"][0],
            "promised_tokens": promised_tokens(params, len(prompt)), "restored_tokens": restored(c["usage"], counters),
            "params": params, "counters": counters}


def recompute(cons: Endpoint, prompt: List[int], decode_tokens: int) -> dict:
    before = cons.counters()
    c = cons.stream(prompt, decode_tokens, None)
    counters = _delta(before, cons.counters())
    return {"recompute_s": c["ttft_s"], "restored_tokens": restored(c["usage"], counters), "counters": counters}


def check(rep: dict, expect_match: bool) -> List[str]:
    """Why a repetition is not what its name says ([] when it is)."""
    h, r, bad = rep["handoff"], rep["recompute"], []
    if h["promised_tokens"] <= 0:
        bad.append(f"the producer promised no pages ({h['params']})")
    elif h["restored_tokens"] is not None and h["restored_tokens"] < h["promised_tokens"]:
        bad.append(f"the consumer restored {h['restored_tokens']} of {h['promised_tokens']} promised tokens")
    if r["restored_tokens"]:
        bad.append(f"the recompute prompt restored {r['restored_tokens']} tokens (not cold)")
    if expect_match and h["producer_token"] != h["consumer_token"]:
        bad.append(f"first tokens differ: producer {h['producer_token']}, consumer {h['consumer_token']}")
    return bad


def run(prod: Endpoint, cons: Endpoint, prompt_tokens: int, reps: int, vocab: int, seed: int,
        decode_tokens: int, warmup: int) -> dict:
    rng = random.Random(seed)
    fresh = lambda: [rng.randrange(vocab) for _ in range(prompt_tokens)]  # noqa: E731
    out: Dict[str, Any] = {"prompt_tokens": prompt_tokens, "reps": reps, "warmup": [], "samples": []}
    for i in range(warmup + reps):
        rep = {"handoff": handoff(prod, cons, fresh(), decode_tokens), "recompute": recompute(cons, fresh(), decode_tokens)}
        out["warmup" if i < warmup else "samples"].append(rep)
    return out


def summarize(res: dict, expect_match: bool) -> dict:
    s = res["samples"]
    med = lambda xs: round(statistics.median(xs), 5) if xs else None  # noqa: E731
    h = [x["handoff"] for x in s]
    m = {"prefill_s": med([x["prefill_s"] for x in h]), "handoff_s": med([x["handoff_s"] for x in h]),
         "pd_ttft_s": med([x["pd_ttft_s"] for x in h]), "recompute_s": med([x["recompute"]["recompute_s"] for x in s])}
    m["handoff_over_recompute"] = round(m["handoff_s"] / m["recompute_s"], 4) if s else None
    res["medians"] = m
    res["first_tokens_match"] = sum(x["producer_token"] == x["consumer_token"] for x in h)
    res["problems"] = {i: p for i, rep in enumerate(s) if (p := check(rep, expect_match))}
    return res


def table(res: dict) -> str:
    ms = lambda v: f"{v * 1e3:8.1f}" if v is not None else "       -"  # noqa: E731
    rows = [f"P/D handoff, {res['prompt_tokens']}-token prompts, {len(res['samples'])} repetitions (+ warm-up), ms",
            "rep  prefill(P)  handoff(C)  P/D TTFT  recompute(C)  restored/promised  first tok P=C"]
    for i, rep in enumerate(res["samples"]):
        h, r = rep["handoff"], rep["recompute"]
        rows.append(f"{i:3d}  {ms(h['prefill_s'])}    {ms(h['handoff_s'])}  {ms(h['pd_ttft_s'])}  {ms(r['recompute_s'])}"
                    f"      {h['restored_tokens']}/{h['promised_tokens']}          {h['producer_token'] == h['consumer_token']}")
    m = res["medians"]
    rows.append(f"med  {ms(m['prefill_s'])}    {ms(m['handoff_s'])}  {ms(m['pd_ttft_s'])}  {ms(m['recompute_s'])}"
                f"   handoff/recompute {m['handoff_over_recompute']}")
    for i, p in res["problems"].items():
        rows.append(f"rep {i}: " + "; ".join(p))
    return "\n".join(rows)


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python3 -m orbitkv.refengine.pdprobe", description=__doc__.splitlines()[0])
    p.add_argument("--producer", required=True, help="the prefill engine's base URL (kv_producer)")
    p.add_argument("--consumer", required=True, help="the decode engine's base URL (kv_consumer)")
    p.add_argument("--consumer-metrics", default=None, help="the consumer's /metrics URL (counter deltas per sample)")
    p.add_argument("--model", default=None, help="the model field (vLLM's --served-model-name)")
    p.add_argument("--prompt-tokens", type=int, default=8192)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1, help="repetitions run first and not counted")
    p.add_argument("--vocab", type=int, default=151_936, help="prompt token ids are drawn from [0, vocab)")
    p.add_argument("--decode-tokens", type=int, default=4, help="max_tokens of the consumer's requests")
    p.add_argument("--seed", type=int, default=1, help="prompt seed (use a fresh peer or another seed per run)")
    p.add_argument("--timeout-s", type=float, default=120.0, help="each request's socket timeout")
    p.add_argument("--strict", action="store_true", help="exit 1 unless every sample is what its name says")
    p.add_argument("--expect-match", action="store_true", help="with --strict: the first tokens must match too")
    p.add_argument("--json", default=None, help="write every sample and the medians here")
    return p.parse_args(argv)


def main(argv=None) -> int:
    a = parse_args(argv)
    prod = Endpoint(a.producer, a.model, a.timeout_s)
    cons = Endpoint(a.consumer, a.model, a.timeout_s, a.consumer_metrics)
    try:
        res = summarize(run(prod, cons, a.prompt_tokens, a.reps, a.vocab, a.seed, a.decode_tokens, a.warmup),
                        a.expect_match)
    except (ProbeError, OSError, ValueError) as e:
        print(f"pdprobe: {e}", file=sys.stderr)
        return 2
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f, indent=1)
    print(table(res), flush=True)
    return 1 if a.strict and res["problems"] else 0


if __name__ == "__main__":
    sys.exit(main())
