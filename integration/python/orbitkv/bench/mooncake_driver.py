"""Mooncake Store side of `orbitkv bench tiers`: the same pages, put and got through Mooncake.

Run by the Go benchmark with the Python of Mooncake's own environment
(scripts/install-mooncake.sh); it imports nothing from the orbitkv package but pages.py beside
it, so the file runs as a plain script. It starts a throwaway `mooncake_master` on free loopback
ports, builds an engine KV buffer in the vLLM FlashAttention layout (the geometry and
the seed come from the command line, the page bytes from the seed), and moves every
page through Mooncake Store with its zero-copy scatter-gather API, the fastest one its
docs describe for a KV layout: `register_buffer` on the whole engine buffer, then
`batch_put_from_multi_buffers` (a page's 2 x layers block runs gathered straight from
the buffer into one object) and `batch_get_into_multi_buffers` (scattered back into
other blocks). Every byte got back is compared with the byte put, outside the timing.

Placement (--placement):
  local   the store client that puts and gets also holds the memory segment, so
          Mooncake copies with memcpy (its default when only TCP is available,
          MC_STORE_MEMCPY): its fastest path on one host.
  remote  a second process holds the segment (as a storage node would) and the
          engine's client holds none: the bytes cross loopback TCP.

Prints one JSON object on stdout: the rounds' GB/s of each direction and the bytes
checked. Logs of Mooncake itself go to stderr.
"""

import argparse
import ctypes
import json
import mmap
import os
import signal
import subprocess
import sys
import time

# Mooncake's TCP transport queues at most MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER (default 1,024)
# transfers per peer and rejects the rest at once: a 32-page batch is 2,304 block runs, so its
# last pages failed (TRANSFER_FAIL, -800, "TCP lane queue-full rejection"). A deeper queue lets a
# batch the size OrbitKV's requests have through; it adds no speed.
os.environ.setdefault("MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER", "8192")
os.environ.setdefault("MC_TCP_MAX_PENDING_ADMISSIONS_PER_PEER", "8192")

try:
    from .pages import Layout, check, die_with_parent, fill, free_port, layout_args, wait_listening, zero_destinations
except ImportError:  # run as a script: pages.py sits beside it
    from pages import Layout, check, die_with_parent, fill, free_port, layout_args, wait_listening, zero_destinations


def start_master():
    """Starts mooncake_master on free loopback ports; returns (process, "127.0.0.1:port")."""
    binary = os.path.join(sys.prefix, "bin", "mooncake_master")
    rpc, metrics = free_port(), free_port()
    args = [binary, f"--rpc_port={rpc}", "--rpc_address=127.0.0.1", f"--metrics_port={metrics}",
            "--metrics_host=127.0.0.1", "--enable_http_metadata_server=false"]
    proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=sys.stderr, stderr=sys.stderr,
                            preexec_fn=die_with_parent)
    try:
        wait_listening(rpc, proc, 30)
    except Exception:
        proc.kill()
        proc.wait()
        raise
    return proc, f"127.0.0.1:{rpc}"


def new_store(master, segment_bytes, local_buffer_bytes):
    from mooncake.store import MooncakeDistributedStore

    store = MooncakeDistributedStore()
    rc = store.setup("127.0.0.1", "P2PHANDSHAKE", segment_bytes, local_buffer_bytes, "tcp", "", master)
    if rc != 0:
        raise RuntimeError(f"mooncake store setup against {master}: status {rc}")
    return store


def hold(master, segment_bytes):
    """The remote placement's storage node: mounts a segment, says so, and keeps it until stdin closes."""
    store = new_store(master, segment_bytes, 0)
    print("ready", flush=True)
    sys.stdin.read()
    store.close()


def timed_batches(fn, lay, base, batch, keys, dest):
    t0 = time.perf_counter()
    for i in range(0, len(keys), batch):
        pages = range(i, min(i + batch, len(keys)))
        runs = [lay.runs(base, p, dest) for p in pages]
        rcs = fn([keys[p] for p in pages], [[a for a, _ in r] for r in runs], [[n for _, n in r] for r in runs])
        bad = [(keys[p], rc) for p, rc in zip(pages, rcs) if rc < 0 or (dest and rc != lay.page_bytes)]
        if len(rcs) != len(pages) or bad:
            raise RuntimeError(f"mooncake {'get' if dest else 'put'} failed: {bad[:3] or rcs}")
    return time.perf_counter() - t0


def bench(a):
    lay = Layout(a)
    mm = mmap.mmap(-1, lay.size)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mm))
    fill(mm, a.seed)
    master, addr = start_master()
    holder, store = None, None
    try:
        # A segment for one round's pages plus the allocator's slack; pages are removed between rounds.
        segment = (lay.pages * lay.page_bytes * 5 // 4 + (64 << 20)) & ~((1 << 20) - 1)
        if a.placement == "remote":
            holder = subprocess.Popen([sys.executable, __file__, "--hold", "--master", addr, "--segment", str(segment)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=sys.stderr, text=True,
                                      preexec_fn=die_with_parent)
            if holder.stdout.readline().strip() != "ready":
                raise RuntimeError(f"segment holder exited with {holder.wait()} before mounting")
            store = new_store(addr, 0, 16 << 20)
        else:
            store = new_store(addr, segment, 16 << 20)
        if store.register_buffer(base, lay.size) != 0:
            raise RuntimeError("register_buffer of the engine buffer failed")
        rounds, checked = [], 0
        for r in range(a.rounds):
            zero_destinations(mm, base, lay)
            keys = [f"orbitkv-bench-{a.seed}-{r}-{p}" for p in range(lay.pages)]
            put = timed_batches(store.batch_put_from_multi_buffers, lay, base, a.batch, keys, False)
            get = timed_batches(store.batch_get_into_multi_buffers, lay, base, a.batch, keys, True)
            checked += sum(check(mm, base, lay, p) for p in range(lay.pages))
            total = lay.pages * lay.page_bytes
            rounds.append({"put_gbps": total / put / 1e9, "get_gbps": total / get / 1e9})
            store.remove_all(True)
        store.unregister_buffer(base)
        import importlib.metadata as md
        json.dump({"version": md.version("mooncake-transfer-engine-non-cuda"), "placement": a.placement,
                   "api": "batch_put_from_multi_buffers/batch_get_into_multi_buffers", "page_bytes": lay.page_bytes,
                   "pages": lay.pages, "rounds": rounds, "bytes_checked": checked}, sys.stdout)
        print(flush=True)
    finally:
        if store is not None:
            store.close()
        if holder is not None:
            holder.stdin.close()
            holder.wait()
        master.kill()
        master.wait()


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    layout_args(p, "pages per batch call")
    p.add_argument("--placement", choices=["local", "remote"], default="local")
    p.add_argument("--hold", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--master", help=argparse.SUPPRESS)
    p.add_argument("--segment", type=int, help=argparse.SUPPRESS)
    a = p.parse_args()
    # SIGTERM (the Go side cancelling) unwinds through the finally blocks that stop the children.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if a.hold:
        hold(a.master, a.segment)
    else:
        bench(a)


if __name__ == "__main__":
    main()
