"""A deterministic byte tokenizer: text → UTF-8 bytes → ids 0..255.

Decoding is for display only: ids of printable ASCII (and \\t, \\n) become that character,
every other id becomes "<|id|>", so each token's text stands alone in a stream.
"""

from __future__ import annotations

from typing import List, Sequence


def encode(text: str) -> List[int]:
    return list(text.encode("utf-8"))


def token_text(token_id: int) -> str:
    if 32 <= token_id < 127 or token_id in (9, 10):
        return chr(token_id)
    return f"<|{token_id}|>"


def decode(token_ids: Sequence[int]) -> str:
    return "".join(token_text(t) for t in token_ids)
