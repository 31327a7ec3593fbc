"""What the peer-system drivers share: the engine KV buffer's page layout, the seeded page bytes,
the byte check, and starting a child server on a free loopback port.

Imported by the drivers (run as scripts, so from their own directory) and by their tests."""

import ctypes
import random
import signal
import socket
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port, proc, deadline_s):
    """Waits until something accepts on 127.0.0.1:port, or fails when proc exits or the deadline passes."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited with {proc.returncode} before listening")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise RuntimeError(f"{proc.args[0]} did not listen on port {port} within {deadline_s}s")


def die_with_parent():
    """preexec_fn of the children: the kernel kills them when the driver dies (PR_SET_PDEATHSIG)."""
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)


def layout_args(p, batch_help="pages per batch call"):
    """The flags Layout reads, and the run's shape, on an argparse parser (Go's bench tiers passes them)."""
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--kv-heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--block-tokens", type=int, default=16)
    p.add_argument("--page-tokens", type=int, default=64)
    p.add_argument("--elem-bytes", type=int, default=2)
    p.add_argument("--pages", type=int, default=64)
    p.add_argument("--batch", type=int, default=32, help=batch_help)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--seed", type=int, default=1)
    return p


class Layout:
    """The vLLM FlashAttention KV buffer: [layer][K,V][block] runs of block_bytes each."""

    def __init__(self, a):
        self.layers, self.per = a.layers, a.page_tokens // a.block_tokens
        self.block_bytes = a.block_tokens * a.kv_heads * a.head_dim * a.elem_bytes
        self.pages = a.pages
        self.num_blocks = 2 * a.pages * self.per  # sources, then destinations
        self.size = self.layers * 2 * self.num_blocks * self.block_bytes
        self.page_bytes = self.layers * 2 * self.per * self.block_bytes

    def runs(self, base, page, dest):
        """(address, length) of each of a page's 2 x layers contiguous runs."""
        first = ((self.pages if dest else 0) + page) * self.per
        n = self.per * self.block_bytes
        return [(base + ((l * 2 + p) * self.num_blocks + first) * self.block_bytes, n)
                for l in range(self.layers) for p in range(2)]


def fill(mm, seed):
    """Page bytes from the seed: the same seed gives the same buffer."""
    rng, chunk = random.Random(seed), 64 << 20
    for off in range(0, len(mm), chunk):
        n = min(chunk, len(mm) - off)
        mm[off:off + n] = rng.randbytes(n)


def check(mm, base, lay, page):
    """Compares every byte of a page's destination runs with its source runs."""
    for (s, n), (d, _) in zip(lay.runs(base, page, False), lay.runs(base, page, True)):
        if mm[s - base:s - base + n] != mm[d - base:d - base + n]:
            raise RuntimeError(f"page {page}: bytes got back differ from the bytes put")
    return lay.page_bytes


def zero_destinations(mm, base, lay):
    zeros = bytes(lay.per * lay.block_bytes)
    for page in range(lay.pages):
        for d, n in lay.runs(base, page, True):
            mm[d - base:d - base + n] = zeros
