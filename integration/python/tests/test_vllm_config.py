import importlib
import types

import pytest

from orbitkv.vllm._compat import vllm_byte_layout
from orbitkv.vllm.config import load_config


def _vllm_config(extra):
    mc = types.SimpleNamespace(
        model="Qwen/Qwen3-8B", revision="b968826", dtype="torch.bfloat16",
        get_num_layers=lambda pc: 36, get_num_kv_heads=lambda pc: 8, get_head_size=lambda: 128,
    )
    return types.SimpleNamespace(
        model_config=mc,
        parallel_config=types.SimpleNamespace(tensor_parallel_size=2),
        cache_config=types.SimpleNamespace(block_size=16, cache_dtype="auto"),
        kv_transfer_config=types.SimpleNamespace(kv_connector_extra_config=extra),
    )


def test_layout_derived_from_vllm_config():
    cfg = load_config(_vllm_config({"socket": "/s"}))
    lay = cfg.layout
    assert (lay.model, lay.dtype, lay.num_layers, lay.kv_heads, lay.head_dim, lay.tp_size) == (
        "Qwen/Qwen3-8B", "bf16", 36, 8, 128, 2)
    assert cfg.block_tokens == 16 and lay.page_tokens == 64 and cfg.blocks_per_page == 4
    # The byte layout is what the installed vLLM allocates (packed from 0.26 on); without vLLM
    # the 5-D layout the reference engine uses.
    assert lay.byte_layout == (vllm_byte_layout(16) or "vllm-flash")


def test_extra_config_overrides_and_validation():
    cfg = load_config(_vllm_config({"socket": "/s", "page_tokens": 32, "layout": {"revision": "x"}}))
    assert cfg.layout.page_tokens == 32 and cfg.layout.revision == "x"
    with pytest.raises(ValueError, match="socket"):
        load_config(_vllm_config({}))
    with pytest.raises(ValueError, match="multiple"):
        load_config(_vllm_config({"socket": "/s", "page_tokens": 24}))
    assert load_config(_vllm_config({"socket": "/s"})).recompute_tokens_per_s == 0
    assert load_config(_vllm_config({"socket": "/s", "recompute_tokens_per_s": 25000})).recompute_tokens_per_s == 25000
    with pytest.raises(ValueError, match="recompute_tokens_per_s"):
        load_config(_vllm_config({"socket": "/s", "recompute_tokens_per_s": -1}))


def test_loadable_the_way_vllms_factory_loads_it():
    mod = importlib.import_module("orbitkv.vllm")
    cls = getattr(mod, "OrbitKVConnector")
    assert cls.get_required_kvcache_layout(None) == "NHD"
    for name in ("get_num_new_matched_tokens", "update_state_after_alloc", "build_connector_meta",
                 "update_connector_output", "request_finished", "register_kv_caches", "start_load_kv",
                 "wait_for_layer_load", "save_kv_layer", "wait_for_save", "get_finished",
                 "get_transfer_results", "get_block_ids_with_load_errors", "handle_preemptions", "shutdown"):
        assert callable(getattr(cls, name)), name


def test_gate_accepts_true_false_and_strict():
    assert (load_config(_vllm_config({"socket": "/s"})).gate, load_config(_vllm_config({"socket": "/s"})).gate_strict) == (True, False)
    c = load_config(_vllm_config({"socket": "/s", "gate": "strict"}))
    assert (c.gate, c.gate_strict) == (True, True)
    assert load_config(_vllm_config({"socket": "/s", "gate": False})).gate is False
    with pytest.raises(ValueError, match="gate"):
        load_config(_vllm_config({"socket": "/s", "gate": "sometimes"}))
