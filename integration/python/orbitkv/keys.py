"""Layout fingerprints and chained page keys (DESIGN.md §2).

Byte-for-byte the same as internal/pagekey (Go); the shared vectors in
internal/pagekey/testdata/vectors.json prove it.

fingerprint = SHA-256("orbitkv.layout.v1" ‖ str(model) ‖ str(revision) ‖
    str(dtype) ‖ u32(num_layers) ‖ u32(kv_heads) ‖ u32(head_dim) ‖
    u32(tp_rank) ‖ u32(tp_size) ‖ u32(page_tokens) ‖ str(byte_layout))[:16]
key[i] = SHA-256(fp ‖ key[i-1] ‖ page i tokens as u32 LE ‖ extra(i))[:16],
key[-1] = 0¹⁶

extra(i) is empty for a page without extras (the keys of a request without
any are those of the first OrbitKV releases), else

    "orbitkv.extra.v1" ‖ u32(count) ‖ item…
    item = u8(kind) ‖ u32(len(body)) ‖ body, kinds in this order:
      1 LoRA      str(name) ‖ str(path)                  every page
      2 MM input  str(id) ‖ i64(offset − page start) ‖ u64(length)
                  each input whose placeholder range overlaps the page, by offset
      3 salt      str(cache_salt)                        page 0, non-empty salt
      4 embeds    SHA-256 of the page's prompt-embedding bytes (32 bytes)

what vLLM's own prefix cache keys a block on (generate_block_hash_extra_keys),
at page granularity; later pages depend on it through the chain. Extras
that cannot be keyed raise ExtrasError: the request must be a miss.

A P/D handoff's partial last page has a tail key (tail_key, docs/pd.md),
in a domain of its own: never a page key, never chained on.
"""

from __future__ import annotations

import dataclasses
import hashlib
import struct
from typing import Any, Mapping, Optional, Sequence

KEY_SIZE = 16
ZERO_KEY = bytes(KEY_SIZE)
_LAYOUT_DOMAIN = b"orbitkv.layout.v1"
_EXTRA_DOMAIN = b"orbitkv.extra.v1"
EXTRA_LORA, EXTRA_MM, EXTRA_SALT, EXTRA_EMBEDS = 1, 2, 3, 4
_MAX_POS = 1 << 62


class ExtrasError(ValueError):
    """A request's extras cannot be keyed: it must be a miss, its pages unsaved."""


@dataclasses.dataclass(frozen=True)
class LoRA:
    """The adapter a request runs under (vLLM keys its name; the path too here)."""

    name: str
    path: str = ""


@dataclasses.dataclass(frozen=True)
class MMInput:
    """A multimodal input: its content hash (vLLM's mm feature identifier) and
    its placeholder tokens' prompt range [offset, offset + length)."""

    id: str
    offset: int
    length: int


@dataclasses.dataclass(frozen=True)
class Extras:
    """What, beside its tokens, makes a request's KV differ from another's with
    the same tokens. ``salt`` "" is none; ``embeds`` holds per whole page the
    SHA-256 of its prompt-embedding bytes (empty: no prompt embeds)."""

    lora: Optional[LoRA] = None
    mm: tuple = ()
    salt: str = ""
    embeds: tuple = ()

    @property
    def empty(self) -> bool:
        return self.lora is None and not self.mm and not self.salt and not self.embeds

    @classmethod
    def from_dict(cls, d: Optional[Mapping[str, Any]]) -> Optional["Extras"]:
        """From the shared vectors' JSON (internal/pagekey RequestExtras)."""
        if d is None:
            return None
        lora = d.get("lora")
        return cls(
            lora=LoRA(lora["name"], lora["path"]) if lora is not None else None,
            mm=tuple(MMInput(m["id"], m["offset"], m["length"]) for m in d.get("mm") or ()),
            salt=d.get("salt", ""),
            embeds=tuple(bytes.fromhex(e) for e in d.get("embeds") or ()),
        )

    def page(self, i: int, page_tokens: int) -> bytes:
        """The encoded extras of page ``i`` (b"" when it has none)."""
        start = i * page_tokens
        end = start + page_tokens
        items: list[bytes] = []

        def item(kind: int, body: bytes) -> None:
            items.append(struct.pack("<BI", kind, len(body)) + body)

        if self.lora is not None:
            item(EXTRA_LORA, _str(self.lora.name) + _str(self.lora.path))
        for m in sorted(self.mm, key=lambda m: m.offset):
            if not m.id or not isinstance(m.id, str):
                raise ExtrasError("a multimodal input without an id")
            if not (0 <= m.offset <= _MAX_POS and 0 <= m.length <= _MAX_POS):
                raise ExtrasError(f"multimodal range {m.offset}+{m.length} out of range")
            if m.offset < end and m.offset + m.length > start:
                item(EXTRA_MM, _str(m.id) + struct.pack("<qQ", m.offset - start, m.length))
        if i == 0 and self.salt:
            item(EXTRA_SALT, _str(self.salt))
        if self.embeds:
            if i >= len(self.embeds) or len(self.embeds[i]) != 32:
                raise ExtrasError(f"no 32-byte embeddings hash for page {i}")
            item(EXTRA_EMBEDS, bytes(self.embeds[i]))
        if not items:
            return b""
        return _EXTRA_DOMAIN + struct.pack("<I", len(items)) + b"".join(items)


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


def next_key(fp: bytes, prev: bytes, tokens: Sequence[int], extra: bytes = b"") -> bytes:
    """Returns the key of the page after ``prev`` holding ``tokens`` with the
    encoded extras ``extra`` (Extras.page; b"" for none)."""
    if len(fp) != KEY_SIZE or len(prev) != KEY_SIZE:
        raise ValueError("fingerprint and previous key must be 16 bytes")
    h = hashlib.sha256(fp)
    h.update(prev)
    h.update(struct.pack("<%dI" % len(tokens), *tokens))
    if extra:
        h.update(extra)
    return h.digest()[:KEY_SIZE]


_TAIL_DOMAIN = b"orbitkv.tail.v1"


def tail_key(fp: bytes, prev: bytes, tokens: Sequence[int], extra: bytes = b"") -> bytes:
    """The key of a prompt's partial last page (a P/D handoff's tail,
    orbitkv.vllm.pd): ``tokens`` (1 .. page_tokens - 1 of them) after the
    whole pages whose last key is ``prev`` (ZERO_KEY: none), with the encoded
    extras of that page index. SHA-256("orbitkv.tail.v1" ‖ fp ‖ prev ‖
    u32(count) ‖ tokens as u32 LE ‖ extra)[:16]: the domain keeps it apart
    from every page key (whose preimage starts with the 16-byte fingerprint)
    and the count from any other tail; no page key chains on it. Python
    only: the peer stores it as an ordinary (padded) page blob."""
    if len(fp) != KEY_SIZE or len(prev) != KEY_SIZE:
        raise ValueError("fingerprint and previous key must be 16 bytes")
    if not tokens:
        raise ValueError("a tail holds at least one token")
    h = hashlib.sha256(_TAIL_DOMAIN)
    h.update(fp)
    h.update(prev)
    h.update(struct.pack("<I", len(tokens)))
    h.update(struct.pack("<%dI" % len(tokens), *tokens))
    if extra:
        h.update(extra)
    return h.digest()[:KEY_SIZE]


def chain(fp: bytes, page_tokens: int, tokens: Sequence[int], max_pages: int | None = None,
          extras: Optional[Extras] = None) -> list[bytes]:
    """Returns the keys of every whole page of ``tokens`` (a partial tail page
    has no key), at most ``max_pages`` of them, under the request's
    ``extras`` (None: none; ExtrasError where they cannot be keyed)."""
    if page_tokens <= 0:
        return []
    n = len(tokens) // page_tokens
    if max_pages is not None:
        n = min(n, max_pages)
    return extend_chain(fp, page_tokens, tokens[: n * page_tokens], [], extras)


def extend_chain(fp: bytes, page_tokens: int, tokens: Sequence[int], keys: list[bytes],
                 extras: Optional[Extras] = None) -> list[bytes]:
    """Appends to ``keys`` (a chain prefix of ``tokens`` under ``extras``) the
    keys of the remaining whole pages, without rehashing the known ones."""
    if extras is not None and extras.empty:
        extras = None
    prev = keys[-1] if keys else ZERO_KEY
    for i in range(len(keys), len(tokens) // page_tokens):
        extra = extras.page(i, page_tokens) if extras is not None else b""
        prev = next_key(fp, prev, tokens[i * page_tokens : (i + 1) * page_tokens], extra)
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
    p.add_argument("--extras", default=None,
                   help='the request\'s extras as JSON, e.g. {"lora":{"name":"a","path":"/p"},'
                        '"mm":[{"id":"H","offset":10,"length":100}],"salt":"s"} (the shared vectors\' form)')
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
        extras = Extras.from_dict(json.loads(a.extras)) if a.extras else None
        ks = chain(layout.fingerprint(), layout.page_tokens, tokens, extras=extras)
    except (ValueError, KeyError, TypeError) as e:
        p.error(f"bad --layout, --tokens or --extras: {e!r}")
    for k in ks:
        print(k.hex())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
