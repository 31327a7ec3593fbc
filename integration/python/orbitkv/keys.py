"""Layout fingerprints and chained page keys (DESIGN.md §2).

Byte-for-byte the same as internal/pagekey (Go); the shared vectors in
internal/pagekey/testdata/vectors.json prove it.

fingerprint = SHA-256("orbitkv.layout.v1" ‖ str(model) ‖ str(revision) ‖
    str(dtype) ‖ u32(num_layers) ‖ u32(kv_heads) ‖ u32(head_dim) ‖
    u32(tp_rank) ‖ u32(tp_size) ‖ u32(page_tokens) ‖ str(byte_layout))[:16]
key[i] = SHA-256(fp ‖ key[i-1] ‖ page i tokens as u32 LE)[:16], key[-1] = 0¹⁶
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Any, Mapping, Sequence

KEY_SIZE = 16
ZERO_KEY = bytes(KEY_SIZE)
_LAYOUT_DOMAIN = b"orbitkv.layout.v1"


@dataclasses.dataclass(frozen=True)
class Layout:
    """What makes KV bytes interchangeable; mirrors orbitkv.v1.Layout."""

    model: str
    revision: str
    dtype: str
    num_layers: int
    kv_heads: int
    head_dim: int
    tp_rank: int
    tp_size: int
    page_tokens: int
    byte_layout: str

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "Layout":
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: d[n] for n in names})

    def with_rank(self, tp_rank: int) -> "Layout":
        return dataclasses.replace(self, tp_rank=tp_rank)

    def fingerprint(self) -> bytes:
        return fingerprint(self)

    def to_proto(self) -> Any:
        from orbitkv._proto import engine_pb2

        return engine_pb2.Layout(**dataclasses.asdict(self))


def _str(s: str) -> bytes:
    b = s.encode("utf-8")
    return struct.pack("<I", len(b)) + b


def fingerprint(layout: Layout) -> bytes:
    """Returns the 16-byte layout fingerprint."""
    h = hashlib.sha256(_LAYOUT_DOMAIN)
    h.update(_str(layout.model))
    h.update(_str(layout.revision))
    h.update(_str(layout.dtype))
    h.update(
        struct.pack(
            "<6I",
            layout.num_layers,
            layout.kv_heads,
            layout.head_dim,
            layout.tp_rank,
            layout.tp_size,
            layout.page_tokens,
        )
    )
    h.update(_str(layout.byte_layout))
    return h.digest()[:KEY_SIZE]


def next_key(fp: bytes, prev: bytes, tokens: Sequence[int]) -> bytes:
    """Returns the key of the page after ``prev`` holding ``tokens``."""
    if len(fp) != KEY_SIZE or len(prev) != KEY_SIZE:
        raise ValueError("fingerprint and previous key must be 16 bytes")
    h = hashlib.sha256(fp)
    h.update(prev)
    h.update(struct.pack("<%dI" % len(tokens), *tokens))
    return h.digest()[:KEY_SIZE]


def chain(fp: bytes, page_tokens: int, tokens: Sequence[int], max_pages: int | None = None) -> list[bytes]:
    """Returns the keys of every whole page of ``tokens`` (a partial tail page
    has no key), at most ``max_pages`` of them."""
    if page_tokens <= 0:
        return []
    n = len(tokens) // page_tokens
    if max_pages is not None:
        n = min(n, max_pages)
    keys: list[bytes] = []
    prev = ZERO_KEY
    for i in range(n):
        prev = next_key(fp, prev, tokens[i * page_tokens : (i + 1) * page_tokens])
        keys.append(prev)
    return keys


def extend_chain(fp: bytes, page_tokens: int, tokens: Sequence[int], keys: list[bytes]) -> list[bytes]:
    """Appends to ``keys`` (a chain prefix of ``tokens``) the keys of the
    remaining whole pages, without rehashing the known ones."""
    prev = keys[-1] if keys else ZERO_KEY
    for i in range(len(keys), len(tokens) // page_tokens):
        prev = next_key(fp, prev, tokens[i * page_tokens : (i + 1) * page_tokens])
        keys.append(prev)
    return keys


def main(argv: Sequence[str] | None = None) -> int:
    """``orbitkv-keys --layout JSON|FILE --tokens IDS``: prints the page keys
    of a prompt's token ids under an engine's layout, one hex key a line —
    the keys the adapters save and look up, and the chain ``orbitkv catalog
    lookup --layout L --tokens T`` asks the peer about."""
    import argparse
    import json
    import os
    import re
    import sys

    p = argparse.ArgumentParser(prog="orbitkv-keys", description=main.__doc__.splitlines()[0])
    p.add_argument("--layout", required=True, help="JSON object with every Layout field, or a file holding it")
    p.add_argument("--tokens", required=True, help="token ids separated by commas or spaces; @FILE reads a file, - stdin")
    a = p.parse_args(argv)
    text = a.layout if a.layout.lstrip().startswith("{") else open(a.layout).read()
    if a.tokens == "-":
        toks = sys.stdin.read()
    elif a.tokens.startswith("@"):
        toks = open(os.path.expanduser(a.tokens[1:])).read()
    else:
        toks = a.tokens
    try:
        layout = Layout.from_dict(json.loads(text))
        tokens = [int(t) for t in re.split(r"[\s,\[\]]+", toks) if t]
    except (ValueError, KeyError) as e:
        p.error(f"bad --layout or --tokens: {e!r}")
    for k in chain(layout.fingerprint(), layout.page_tokens, tokens):
        print(k.hex())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
