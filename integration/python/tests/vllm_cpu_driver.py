"""Runs a real vLLM engine (vLLM's CPU build) on the qwen3-tiny dummy-weight model with
the OrbitKV connector, as tests/test_vllm_cpu_engine.py's subprocess (vLLM starts its
EngineCore as another process, which needs this script's main guard).

  python vllm_cpu_driver.py SOCKET PROMPTS.json OUT.json

Generates greedily for every prompt, resets vLLM's own prefix cache, generates again,
and writes {"first": [...], "again": [...]} (output token ids per prompt) to OUT.json.
ORBITKV_DRIVER_EXTRA (a JSON object) adds connector options (e.g. {"layerwise": true})."""

from __future__ import annotations

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the orbitkv package


def block_size() -> int:
    """The smallest KV block vLLM's CPU attention takes: 16 on 0.26, 32 on 0.32 (a 16-token
    block fails there: "No common block size for 16 (CPU_ATTN: [MultipleOf(32)])")."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackend

    size = CPUAttentionBackend.get_supported_kernel_block_sizes()[0]
    return int(getattr(size, "base", size))


def main() -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    sock, prompts_path, out_path = sys.argv[1:4]
    with open(prompts_path) as f:
        prompts = json.load(f)
    kvt = {"kv_connector": "OrbitKVConnector", "kv_connector_module_path": "orbitkv.vllm", "kv_role": "kv_both",
           "kv_load_failure_policy": "recompute",
           "kv_connector_extra_config": dict(json.loads(os.environ.get("ORBITKV_DRIVER_EXTRA", "{}")), socket=sock)}
    llm = LLM(model=os.path.join(HERE, "..", "..", "models", "qwen3-tiny"), load_format="dummy",
              skip_tokenizer_init=True, dtype="float32", enforce_eager=True, block_size=block_size(), max_model_len=2048,
              enable_prefix_caching=True, kv_transfer_config=kvt, seed=0)
    sp = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    batch = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    first = [list(o.outputs[0].token_ids) for o in llm.generate(batch, sp, use_tqdm=False)]
    llm.reset_prefix_cache()
    again = [list(o.outputs[0].token_ids) for o in llm.generate(batch, sp, use_tqdm=False)]
    with open(out_path, "w") as f:
        json.dump({"first": first, "again": again}, f)


if __name__ == "__main__":
    main()
