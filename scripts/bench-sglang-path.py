"""bench: SGLang's HiCache L3 path through OrbitKV, on a CPU, beside a copy of the same bytes.

SGLang's own host pool (MHATokenToKVPoolHost, Qwen3-8B geometry: 36 layers, 8 KV heads, head dim
128, bf16, 64-token pages of 9 MiB), allocated as SGLang does with "allocator":"shm" (a memfd the
peer maps: zero copy), the OrbitKV backend (orbitkv.sglang) and a real peer (`orbitkv serve`,
DRAM only). Each round moves --pages pages:
  set  batch_set_v1 of fresh pages (SGLang's backup: an existence lookup, then the save; the peer
       gathers each page's 72 layer segments from the pool into one DRAM slot)
  get  batch_get_v1 of the same pages into other host slots (SGLang's prefetch I/O: the peer
       scatters each DRAM slot into the pool), every byte then compared with the source pages
and, in the same run, the baseline: torch copying the same pages' bytes between two slot ranges
of the same pool, per layer (the one copy a zero-copy path makes), on one thread and on torch's
default threads. Medians of --reps rounds. Run in the SGLang environment:

  make build && ./scripts/install-sglang.sh
  PYTHONPATH=integration/python ~/.cache/orbitkv/sglang-0.5.17/bin/python scripts/bench-sglang-path.py
"""

from __future__ import annotations

import argparse
import hashlib
import os
import socket as socketlib
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from sglang.srt.mem_cache import hicache_storage as hs
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost

from orbitkv.sglang import OrbitKVHiCacheStorage

LAYERS, HEADS, DIM, PAGE = 36, 8, 128, 64
TOKEN_BYTES = LAYERS * 2 * HEADS * DIM * 2  # K and V, bf16: 147,456 bytes


def start_peer(binary: str, tmp: str, dram: str) -> subprocess.Popen:
    sock = os.path.join(tmp, "orbitkv.sock")
    log = open(os.path.join(tmp, "peer.log"), "ab")
    proc = subprocess.Popen([binary, "serve", "--data-dir", tmp, "--socket", sock, "--dram-bytes", dram,
                             "--ssd-bytes", "0", "--cuda", "off", "--metrics-addr", "127.0.0.1:0"],
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            sys.exit(f"orbitkv serve exited {proc.returncode}; see {tmp}/peer.log")
        try:
            with socketlib.socket(socketlib.AF_UNIX) as s:
                s.connect(sock)
            return proc
        except OSError:
            time.sleep(0.1)
    proc.kill()
    sys.exit("orbitkv serve: no socket within 30 s")


def host_pool(pages: int) -> MHATokenToKVPoolHost:
    dev = MHATokenToKVPool(size=PAGE, page_size=PAGE, dtype=torch.bfloat16, head_num=HEADS, head_dim=DIM,
                           layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    gb = -(-(2 * pages + 1) * PAGE * TOKEN_BYTES // 10**9)  # SGLang's host size is whole GB
    hp = MHATokenToKVPoolHost(dev, 1.0, gb, PAGE, "layer_first", pin_memory=False, device="cpu",
                              allocator_type="shm")
    if hp.size < 2 * pages * PAGE:
        sys.exit(f"host pool of {hp.size} tokens, want {2 * pages * PAGE}")
    # every byte distinct enough to catch a page in the wrong place: a random block, tiled
    block = torch.randint(-32768, 32767, (1 << 20,), dtype=torch.int16)
    flat = hp.kv_buffer.view(-1).view(torch.int16)
    for lo in range(0, flat.numel(), block.numel()):
        n = min(block.numel(), flat.numel() - lo)
        flat[lo:lo + n] = block[:n].roll(lo // block.numel() * 7919)
    return hp


def config(sock: str) -> hs.HiCacheStorageConfig:
    extra = {"socket": sock, "interface_v1": 1}
    return hs.HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                   is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                                   model_name="Qwen/Qwen3-8B", extra_config=extra)


def indices(first: int, pages: int) -> torch.Tensor:
    return torch.arange(first * PAGE, (first + pages) * PAGE, dtype=torch.int64)


def keys(rnd: int, pages: int) -> list[str]:
    out, prev = [], b""
    for i in range(pages):
        prev = hashlib.sha256(prev + f"bench-{rnd}-{i}".encode()).digest()
        out.append(prev.hex())
    return out


def same_pages(hp, src: int, dst: int, pages: int) -> bool:
    kv = hp.kv_buffer  # layer_first: (2, layers, tokens, heads, dim)
    a, b = kv[:, :, src * PAGE:(src + pages) * PAGE], kv[:, :, dst * PAGE:(dst + pages) * PAGE]
    return torch.equal(a.view(torch.int16), b.view(torch.int16))


def copy_round(hp, src: int, dst: int, pages: int) -> float:
    kv = hp.kv_buffer
    t = time.perf_counter()
    for layer in range(LAYERS):
        kv[:, layer, dst * PAGE:(dst + pages) * PAGE].copy_(kv[:, layer, src * PAGE:(src + pages) * PAGE])
    return time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=128, help="pages a round (128 = an 8K-token prompt)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bin", default=os.environ.get("ORBITKV_BIN", "bin/orbitkv"))
    a = ap.parse_args()
    n, gb = a.pages, a.pages * PAGE * TOKEN_BYTES / 1e9
    hp = host_pool(n)
    with tempfile.TemporaryDirectory(prefix="okv-sglbench-", dir="/tmp") as tmp:
        dram = f"{int(gb * (a.reps + 1) / 2**30 * 1e9) + 1}GiB"
        peer = start_peer(a.bin, tmp, dram)
        be = OrbitKVHiCacheStorage(config(os.path.join(tmp, "orbitkv.sock")), {})
        try:
            be.register_mem_pool_host(hp)
            if not be.zero_copy:
                sys.exit("the host pool was not registered zero copy")
            sets, gets = [], []
            for r in range(a.reps):
                ks = keys(r, n)
                t = time.perf_counter()
                ok = be.batch_set_v1(ks, indices(0, n))
                sets.append(time.perf_counter() - t)
                if ok != [True] * n:
                    sys.exit(f"round {r}: set stored {sum(ok)} of {n} pages")
                hp.kv_buffer[:, :, n * PAGE:2 * n * PAGE].zero_()
                t = time.perf_counter()
                ok = be.batch_get_v1(ks, indices(n, n))
                gets.append(time.perf_counter() - t)
                if ok != [True] * n or not same_pages(hp, 0, n, n):
                    sys.exit(f"round {r}: get returned {sum(ok)} of {n} pages or bytes that differ")
        finally:
            be.close()
            peer.terminate()
            peer.wait(10)
    threads = torch.get_num_threads()
    multi = [copy_round(hp, 0, n, n) for _ in range(a.reps)]
    torch.set_num_threads(1)
    single = [copy_round(hp, 0, n, n) for _ in range(a.reps)]
    if not same_pages(hp, 0, n, n):
        sys.exit("the baseline copy differs")
    med = statistics.median
    one = gb / med(single)
    print(f"SGLang path through OrbitKV: {n} pages of {PAGE * TOKEN_BYTES >> 20} MiB ({gb:.2f} GB) a round, "
          f"{a.reps} rounds, medians; host pool {hp.size} tokens, layer_first, shm (zero copy)")
    print(f"  baseline copy, 1 thread:          {one:6.2f} GB/s")
    print(f"  baseline copy, {threads} threads:         {gb / med(multi):6.2f} GB/s")
    for name, ts in (("set (backup: lookup + save)", sets), ("get (prefetch: load)       ", gets)):
        rate = gb / med(ts)
        print(f"  {name}: {rate:6.2f} GB/s = {rate / one:.2f} of the 1-thread copy "
              f"({med(ts) * 1e3:.0f} ms; rounds {', '.join(f'{gb / x:.2f}' for x in ts)})")
    print("  every get's bytes equal the pages set")


if __name__ == "__main__":
    main()
