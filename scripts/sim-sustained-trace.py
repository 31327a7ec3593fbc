#!/usr/bin/env python3
"""Writes the seeds' sustained workload as a trace for `orbitkv sim` (Mooncake FAST'25
format: timestamp ms, input_length, output_length, hash_ids per 512-token block).

Twelve prepared prefixes of 1,024, 4,096 and 8,192 tokens in turn; each request reuses one
(chosen uniformly) with probability 0.75, else brings a new prefix of one of the three sizes
that no later request shares; 16 output tokens; one arrival every 133 ms (the 7.5 req/s
native vLLM served on the H200, docs/benchmarks.md). Deterministic for a seed.

  scripts/sim-sustained-trace.py [--requests 600] [--seed 1] > sustained.jsonl
"""

import argparse
import json
import random
import sys

SIZES = (1024, 4096, 8192)
BLOCK = 512


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=600)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gap-ms", type=int, default=133)
    a = ap.parse_args()
    r = random.Random(a.seed)
    fresh = 10**6  # ids of new prefixes start here, far above the prepared ones'
    for i in range(a.requests):
        if r.random() < 0.75:
            j = r.randrange(12)
            n = SIZES[j % 3]
            ids = [j * 1000 + b for b in range(n // BLOCK)]
        else:
            n = SIZES[r.randrange(3)]
            ids = list(range(fresh, fresh + n // BLOCK))
            fresh += n // BLOCK
        sys.stdout.write(json.dumps({"timestamp": i * a.gap_ms, "input_length": n, "output_length": 16, "hash_ids": ids}) + "\n")


if __name__ == "__main__":
    main()
