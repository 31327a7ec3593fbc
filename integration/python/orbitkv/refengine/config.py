"""Model presets and engine configuration (plain data: nothing here allocates)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Geometry of a Qwen3-architecture decoder."""

    name: str
    num_layers: int
    hidden: int
    num_q_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    rope_theta: float = 1_000_000.0
    rms_eps: float = 1e-6
    tie_embeddings: bool = False
    dtype: str = "fp32"          # "fp32" | "bf16" | "fp16"
    max_positions: int = 40_960  # RoPE table length (tokens)

    def validate(self) -> None:
        if self.num_q_heads % self.num_kv_heads:
            raise ValueError(f"{self.name}: q heads {self.num_q_heads} not a multiple of kv heads {self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"{self.name}: head_dim {self.head_dim} must be even for RoPE")
        if self.dtype not in DTYPES:
            raise ValueError(f"{self.name}: dtype {self.dtype!r} not one of {sorted(DTYPES)}")

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, DTYPES[self.dtype])

    @property
    def dtype_bytes(self) -> int:
        return {"fp32": 4, "bf16": 2, "fp16": 2}[self.dtype]

    def kv_bytes_per_token(self) -> int:
        """Bytes of K and V for one token over all layers."""
        return self.num_layers * 2 * self.num_kv_heads * self.head_dim * self.dtype_bytes

    def num_params(self) -> int:
        h, q, kv = self.hidden, self.num_q_heads * self.head_dim, self.num_kv_heads * self.head_dim
        per_layer = h * q + 2 * h * kv + q * h + 3 * h * self.intermediate + 2 * h + 2 * self.head_dim
        head = 0 if self.tie_embeddings else self.vocab * h
        return self.vocab * h + head + self.num_layers * per_layer + h


DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}

PRESETS = {
    # CPU/CI model: small enough for 2 cores, fp32 so restore == recompute bit for bit.
    "tiny": ModelConfig(
        name="refengine/tiny", num_layers=2, hidden=64, num_q_heads=4, num_kv_heads=2,
        head_dim=16, intermediate=128, vocab=512, rope_theta=10_000.0, tie_embeddings=False,
        dtype="fp32", max_positions=8192),
    # The real Qwen3-8B geometry (random weights), for an H200.
    "qwen3-8b": ModelConfig(
        name="Qwen/Qwen3-8B", num_layers=36, hidden=4096, num_q_heads=32, num_kv_heads=8,
        head_dim=128, intermediate=12288, vocab=151_936, rope_theta=1_000_000.0,
        tie_embeddings=False, dtype="bf16", max_positions=40_960),
}


def preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; known: {', '.join(sorted(PRESETS))}") from None


@dataclasses.dataclass
class EngineConfig:
    """Engine knobs. Units are in the field names or comments."""

    model: ModelConfig
    kv_tokens: int = 16_384           # capacity of the paged KV pool, tokens
    block_size: int = 16              # tokens per engine block
    page_tokens: int = 64             # tokens per OrbitKV page; a multiple of block_size
    device: str = "cpu"               # "cpu" | "cuda" | "cuda:N"
    seed: int = 0                     # weight seed
    max_num_seqs: int = 16            # running requests at most
    max_batched_tokens: int = 2048    # tokens per step (chunked prefill budget)
    attn_backend: str = "auto"        # "exact" (block-ordered, batch invariant) | "sdpa" | "auto"
    attn_chunk_tokens: int = 256      # keys per online-softmax chunk (exact backend)
    invariant_rows: int = -1          # exact backend: token tiles of this size (model.fixed_rows);
                                      # -1 = auto: 64 on CUDA (batch invariance there), 0 on CPU
    enable_prefix_caching: bool = True
    cuda_graphs: str = "auto"         # decode steps as CUDA graph replays: "auto" (CUDA + sdpa) | "on" | "off"
    cuda_graph_sizes: tuple = (1, 2, 4, 8)  # captured batch sizes; a decode batch pads up to the next one
    cuda_graph_max_context: int = 0   # context tokens per request a decode graph covers (0 = kv_tokens)
    shm_dir: str = "/dev/shm"         # where the CPU pool's backing file lives
    engine_id: str = "refengine"

    def validate(self) -> None:
        self.model.validate()
        if self.block_size <= 0 or self.page_tokens <= 0:
            raise ValueError("block_size and page_tokens must be positive")
        if self.page_tokens % self.block_size:
            raise ValueError(f"page_tokens {self.page_tokens} is not a multiple of block_size {self.block_size}")
        if self.kv_tokens < self.block_size:
            raise ValueError(f"kv_tokens {self.kv_tokens} is less than one block ({self.block_size})")
        if self.attn_chunk_tokens % self.block_size:
            raise ValueError(f"attn_chunk_tokens {self.attn_chunk_tokens} is not a multiple of block_size")
        if self.attn_backend not in ("auto", "exact", "sdpa"):
            raise ValueError(f"attn_backend {self.attn_backend!r} not one of auto, exact, sdpa")
        if self.max_num_seqs <= 0 or self.max_batched_tokens <= 0:
            raise ValueError("max_num_seqs and max_batched_tokens must be positive")
        if self.cuda_graphs not in ("auto", "on", "off"):
            raise ValueError(f"cuda_graphs {self.cuda_graphs!r} not one of auto, on, off")
        sizes = tuple(self.cuda_graph_sizes)
        if not sizes or list(sizes) != sorted(set(sizes)) or sizes[0] <= 0:
            raise ValueError(f"cuda_graph_sizes {sizes} must be positive, ascending, without repeats")
        if self.cuda_graph_max_context < 0:
            raise ValueError("cuda_graph_max_context must be >= 0")

    @property
    def num_blocks(self) -> int:
        return self.kv_tokens // self.block_size

    @property
    def resolved_invariant_rows(self) -> int:
        if self.invariant_rows >= 0:
            return self.invariant_rows
        return 64 if self.device.startswith("cuda") and self.resolved_attn_backend == "exact" else 0

    @property
    def resolved_cuda_graphs(self) -> bool:
        """Whether decode steps replay CUDA graphs: never on CPU; "auto" = the sdpa backend on
        CUDA (the exact backend keeps eager steps unless "on": see README, CUDA graphs)."""
        if not self.device.startswith("cuda") or self.cuda_graphs == "off":
            return False
        return self.cuda_graphs == "on" or self.resolved_attn_backend == "sdpa"

    @property
    def resolved_graph_max_context(self) -> int:
        return self.cuda_graph_max_context or self.kv_tokens

    @property
    def resolved_attn_backend(self) -> str:
        if self.attn_backend != "auto":
            return self.attn_backend
        return "sdpa" if self.device.startswith("cuda") else "exact"


def engine_config(preset_name: str, **overrides) -> EngineConfig:
    """An EngineConfig for a preset, with field overrides (None values ignored)."""
    cfg = EngineConfig(model=preset(preset_name), **{k: v for k, v in overrides.items() if v is not None})
    cfg.validate()
    return cfg


def with_model(cfg: EngineConfig, **model_overrides) -> EngineConfig:
    """A copy of cfg with some model fields replaced (tests use it for variants)."""
    return dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, **model_overrides))

