"""orbitkv.refengine — a reference LLM engine that does real transformer compute.

A Qwen3-architecture decoder with deterministic random weights, a paged KV pool in vLLM's
FlashAttention layout (a /dev/shm file on CPU, so a peer can map it), native prefix caching by
chained block hashes, a continuous-batching scheduler with greedy sampling, the vLLM V1 KV
connector call sequence, and an OpenAI-compatible HTTP server.

Invariants:
  * Importing this package allocates nothing; the `qwen3-8b` preset is only a config until an
    Engine is built with it.
  * On CPU fp32 (the `tiny` preset, `exact` attention) a token's logits do not depend on what
    else is in the step: full prefill, chunked prefill, a prefill over restored or cached
    blocks, and batched decode give bit-identical outputs.
  * A block reaches the local prefix cache only after the step that filled it reported no load
    error for it.
"""

from .config import PRESETS, EngineConfig, ModelConfig, engine_config, preset

__all__ = ["PRESETS", "EngineConfig", "ModelConfig", "engine_config", "preset", "Engine"]


def __getattr__(name):  # lazy: keep `import orbitkv.refengine` cheap
    if name == "Engine":
        from .engine import Engine
        return Engine
    raise AttributeError(name)
