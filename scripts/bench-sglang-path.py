"""bench: SGLang's HiCache L3 path through OrbitKV, on a CPU, beside copies of the same bytes.

SGLang's own host pool (MHATokenToKVPoolHost, Qwen3-8B geometry: 36 layers, 8 KV heads, head dim
128, bf16, 64-token pages of 9 MiB, layer_first), allocated as SGLang does with "allocator":"shm"
(a memfd the peer maps: zero copy), the OrbitKV backend (orbitkv.sglang) and a real peer
(`orbitkv serve`, DRAM only). Each round, with bytes of its own in the source pages:
  set  batch_set_v1 of --pages pages under fresh keys (SGLang's backup: an existence lookup, then
       the save; the peer gathers each page's 72 layer segments from the pool into one DRAM slot)
  then the source is overwritten and the peer drained (its background checksums done, untimed)
  get  batch_get_v1 of those pages into other slots (SGLang's prefetch I/O: the peer scatters each
       DRAM slot into the pool), every byte compared with what was set
  and, interleaved in the same round, the baselines: the same bytes (the same 72 runs of the pool)
  copied from the source slots to the target slots by glibc memmove on one thread (Python's
  ctypes), by torch on one thread and by torch on its default threads, each target cleared first
  and compared after.
Medians of --reps rounds, each round's figures printed. The peer copies with non-temporal stores
on a worker a core (up to 8); glibc and torch may not stream at this size, so a ratio above 1
is part store type, part cores. Run in the SGLang environment (make bench-sglang):

  make build && ./scripts/install-sglang.sh
  PYTHONPATH=integration/python ~/.cache/orbitkv/sglang-0.5.17/bin/python scripts/bench-sglang-path.py
"""

from __future__ import annotations

import argparse
import ctypes
import hashlib
import os
import shutil
import signal
import socket as socketlib
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import grpc
import torch
from sglang.srt.mem_cache import hicache_storage as hs
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool

from orbitkv._proto import admin_pb2, admin_pb2_grpc
from orbitkv.sglang import OrbitKVHiCacheStorage, _compat

LAYERS, HEADS, DIM, PAGE = 36, 8, 128, 64
TOKEN_BYTES = LAYERS * 2 * HEADS * DIM * 2  # K and V, bf16: 147,456 bytes
UP_WITHIN_S, DRAIN_S = 30, 60


class Failed(Exception):
    pass


def _die_with_parent() -> None:
    """The peer gets SIGTERM if this process dies first (PR_SET_PDEATHSIG)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


def start_peer(binary: str, tmp: str, dram: str) -> subprocess.Popen:
    sock = os.path.join(tmp, "orbitkv.sock")
    with open(os.path.join(tmp, "peer.log"), "ab") as log:
        proc = subprocess.Popen([binary, "serve", "--data-dir", tmp, "--socket", sock, "--dram-bytes", dram,
                                 "--ssd-bytes", "0", "--cuda", "off", "--metrics-addr", "127.0.0.1:0"],
                                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
                                preexec_fn=_die_with_parent)
    deadline = time.monotonic() + UP_WITHIN_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failed(f"orbitkv serve exited {proc.returncode}")
        try:
            with socketlib.socket(socketlib.AF_UNIX) as s:
                s.settimeout(1)
                s.connect(sock)
            return proc
        except OSError:
            time.sleep(0.1)
    stop(proc)
    raise Failed(f"orbitkv serve: no socket within {UP_WITHIN_S} s")


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


def drain(sock: str) -> None:
    """Waits (bounded) until the peer is idle: its background checksums of
    the pages just saved are done, so they do not run inside a timed get."""
    with grpc.insecure_channel(f"unix:{sock}") as ch:
        r = admin_pb2_grpc.AdminServiceStub(ch).Drain(admin_pb2.DrainRequest(timeout_ms=DRAIN_S * 1000),
                                                     timeout=DRAIN_S + 5)
    if not r.idle:
        raise Failed(f"the peer did not drain within {DRAIN_S} s: {r.detail}")


def host_pool(pages: int) -> Any:
    """A host pool of exactly 2 × pages + 1 pages (SGLang's --hicache-ratio
    path over a one-page device pool): the source, the target, a spare."""
    dev = MHATokenToKVPool(size=PAGE, page_size=PAGE, dtype=torch.bfloat16, head_num=HEADS, head_dim=DIM,
                           layer_num=LAYERS, device="cpu", enable_memory_saver=False)
    hp = _compat.build_mha_host_pool(dev, float(2 * pages + 1), 0, PAGE, "layer_first", pin_memory=False,
                                     device="cpu", allocator_type="shm")
    if hp.size < 2 * pages * PAGE:
        raise Failed(f"host pool of {hp.size} tokens, want {2 * pages * PAGE}")
    return hp


def runs(hp, first: int, pages: int) -> list[torch.Tensor]:
    """The pool's contiguous runs holding pages first..first+pages: per layer,
    K then V (layer_first: (2, layers, tokens, heads, dim))."""
    kv = hp.kv_buffer
    return [kv[p, layer, first * PAGE:(first + pages) * PAGE] for layer in range(LAYERS) for p in range(2)]


def fill(hp, pages: int, seed: int) -> None:
    """New bytes in the source pages: a random block, shifted run by run."""
    g = torch.Generator().manual_seed(seed)
    block = torch.randint(-32768, 32767, (runs(hp, 0, pages)[0].numel(),), dtype=torch.int16, generator=g)
    for i, r in enumerate(runs(hp, 0, pages)):
        r.view(-1).view(torch.int16).copy_(block.roll(i * 7919 + seed))


def snapshot(hp, first: int, pages: int) -> list[torch.Tensor]:
    """A copy of the pages' runs (what the comparisons below hold them to)."""
    return [r.clone() for r in runs(hp, first, pages)]


def equal(hp, first: int, pages: int, want: list[torch.Tensor]) -> bool:
    """Whether the pages' runs hold want's bytes, compared in place, run by run."""
    return all(torch.equal(r.view(torch.int16), w.view(torch.int16)) for r, w in zip(runs(hp, first, pages), want, strict=True))


def clear(hp, first: int, pages: int) -> None:
    for r in runs(hp, first, pages):
        r.zero_()


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


def memmove_copy(hp, src: int, dst: int, pages: int) -> None:
    for s, d in zip(runs(hp, src, pages), runs(hp, dst, pages)):
        ctypes.memmove(d.data_ptr(), s.data_ptr(), s.numel() * s.element_size())


def torch_copy(hp, src: int, dst: int, pages: int) -> None:
    for s, d in zip(runs(hp, src, pages), runs(hp, dst, pages)):
        d.copy_(s)


def timed_copy(hp, pages: int, want: list[torch.Tensor], how, threads: int) -> float:
    clear(hp, pages, pages)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        t = time.perf_counter()
        how(hp, 0, pages, pages)
        took = time.perf_counter() - t
    finally:
        torch.set_num_threads(before)
    if not equal(hp, pages, pages, want):
        raise Failed(f"the baseline copy ({how.__name__}, {threads} thread(s)) differs")
    return took


def one_round(be, hp, sock: str, r: int, n: int, threads: int) -> dict[str, float]:
    fill(hp, n, r + 1)
    want = snapshot(hp, 0, n)
    out = {}
    ks = keys(r, n)
    t = time.perf_counter()
    ok = be.batch_set_v1(ks, indices(0, n))
    out["set"] = time.perf_counter() - t
    if ok != [True] * n:
        raise Failed(f"round {r}: set stored {sum(ok)} of {n} pages")
    drain(sock)
    # the baselines, from the source as it was set
    out["memmove"] = timed_copy(hp, n, want, memmove_copy, 1)
    out["torch1"] = timed_copy(hp, n, want, torch_copy, 1)
    out["torchN"] = timed_copy(hp, n, want, torch_copy, threads)
    clear(hp, 0, n)  # a get served from the source slots would now read zeros
    clear(hp, n, n)
    t = time.perf_counter()
    ok = be.batch_get_v1(ks, indices(n, n))
    out["get"] = time.perf_counter() - t
    if ok != [True] * n or not equal(hp, n, n, want):
        raise Failed(f"round {r}: get returned {sum(ok)} of {n} pages or bytes that differ from those set")
    return out


def report(n: int, reps: int, hp, threads: int, rounds: list[dict[str, float]]) -> None:
    gb = n * PAGE * TOKEN_BYTES / 1e9
    med = {k: statistics.median(x[k] for x in rounds) for k in rounds[0]}
    base = gb / med["memmove"]
    print(f"SGLang path through OrbitKV: {n} pages of {PAGE * TOKEN_BYTES >> 20} MiB ({gb:.2f} GB) a round, "
          f"{reps} rounds, medians; host pool {hp.size} tokens, layer_first, shm (zero copy)")
    names = [("memmove", "baseline: glibc memmove, 1 thread"), ("torch1", "baseline: torch copy, 1 thread"),
             ("torchN", f"baseline: torch copy, {threads} threads"), ("set", "set (backup: lookup + save)"),
             ("get", "get (prefetch: load)")]
    for k, label in names:
        rate = gb / med[k]
        tail = "" if k == "memmove" else f" = {rate / base:.2f}× memmove, {rate / (gb / med['torchN']):.2f}× torch {threads}"
        each = ", ".join(f"{gb / x[k]:.2f}" for x in rounds)
        print(f"  {label:<34} {rate:6.2f} GB/s{tail} (rounds {each})")
    print("  every get's bytes equal the pages set, and every baseline's the source's")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--pages", type=int, default=128, help="pages a round (128 = an 8K-token prompt)")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--bin", default=os.environ.get("ORBITKV_BIN", "bin/orbitkv"))
    a = ap.parse_args()
    n = a.pages
    threads = torch.get_num_threads()
    tmp = tempfile.mkdtemp(prefix="okv-sglbench-", dir="/tmp")
    peer, be, ok = None, None, False
    try:
        hp = host_pool(n)
        # every round's pages stay in DRAM (fresh keys a round), one round spare
        peer = start_peer(a.bin, tmp, f"{-(-(a.reps + 1) * n * PAGE * TOKEN_BYTES // 2**30) + 1}GiB")
        sock = os.path.join(tmp, "orbitkv.sock")
        be = OrbitKVHiCacheStorage(config(sock), {})
        be.register_mem_pool_host(hp)
        if not be.zero_copy:
            raise Failed("the host pool was not registered zero copy")
        if not be.available:
            raise Failed("the backend's session to the peer did not open")
        rounds = [one_round(be, hp, sock, r, n, threads) for r in range(a.reps)]
        report(n, a.reps, hp, threads, rounds)
        ok = True
    except Failed as e:
        print(f"bench-sglang-path: {e}", file=sys.stderr)
    finally:
        try:
            if be is not None:
                be.close()
        finally:
            if peer is not None:
                stop(peer)
        if ok:
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            log = os.path.join(tmp, "peer.log")
            if os.path.exists(log):
                with open(log, "rb") as f:
                    sys.stderr.write(f"peer log ({log}), last lines:\n" + f.read()[-4000:].decode(errors="replace"))
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
