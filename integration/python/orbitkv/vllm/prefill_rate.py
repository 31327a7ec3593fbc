"""The engine's prefill rate, learned from its own steps.

Restoring a page pays only while the peer can deliver it faster than the
engine would recompute it. DRAM always can; an SSD may not (on the H200 on
2026-12-01 vLLM prefilled about 18,000 tokens/s, ~2.7 GB/s of Qwen3-8B KV,
while the SSD tier read ~0.65 GB/s, and SSD restores made serving 0.49x
native). The peer knows its SSD read rate; the engine's rate has to come from
the engine. The scheduler half sees every step it plans (build_connector_meta:
the tokens scheduled, and the time since the previous step was planned, which
is one engine step while the engine is busy), so it can measure that rate
itself instead of asking the operator for a number.

Pure: the caller passes the time of each step and its scheduled tokens.
"""

from __future__ import annotations

import dataclasses
from typing import Optional


@dataclasses.dataclass
class PrefillRate:
    """An exponentially weighted prefill rate (tokens/s) over prefill-heavy
    steps. The caller passes each step's prompt (prefill) tokens, not its
    decode tokens; a step counts when it computed at least ``min_tokens`` of
    them and the next step was planned within ``max_gap_s`` (so an idle
    engine's wait is not taken for compute). ``rate`` is None until
    ``warmup`` steps were seen."""

    min_tokens: int = 512
    max_gap_s: float = 5.0
    alpha: float = 0.2
    warmup: int = 3
    _last_t: Optional[float] = None
    _last_busy: bool = False
    _pending: int = 0  # tokens planned by the previous step, computed by the time this one is planned
    _rate: float = 0.0
    _seen: int = 0

    def step(self, now: float, scheduled_tokens: int) -> None:
        """Records that a step computing ``scheduled_tokens`` prompt tokens was planned at ``now``."""
        if self._last_t is not None and self._last_busy:
            dt = now - self._last_t
            if 0 < dt <= self.max_gap_s and self._pending >= self.min_tokens:
                sample = self._pending / dt
                self._rate = sample if self._seen == 0 else (1 - self.alpha) * self._rate + self.alpha * sample
                self._seen += 1
        self._last_t, self._pending = now, scheduled_tokens
        self._last_busy = scheduled_tokens > 0

    @property
    def rate(self) -> Optional[float]:
        return self._rate if self._seen >= self.warmup else None
