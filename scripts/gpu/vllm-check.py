#!/usr/bin/env python3
"""CPU check of scripts/gpu/vllm.sh's engine command lines against the real vLLM (0.26 or 0.33).

Run with a vLLM test environment (scripts/install-vllm.sh, scripts/install-vllm033.sh), from the
repository root:

  ~/.cache/orbitkv/vllm-0.26.0/bin/python scripts/gpu/vllm-check.py
  ~/.cache/orbitkv/vllm-0.33.0/bin/python scripts/gpu/vllm-check.py

For every config vllm.sh runs on this vLLM (native, ceiling, offload, lmcache, dram, ssd; with
0.33 also offload-okv, vLLM's offloading with OrbitKV as its secondary tier) it takes the exact
argv from `vllm.sh flags CONFIG` and
  1. parses it with vLLM's own `serve` argument parser and builds its EngineArgs: an unknown
     flag, a value outside a flag's choices or a --kv-transfer-config vLLM cannot read fails here
     as it would on the GPU machine;
  2. applies vLLM's own _post_init_kv_transfer_config (what --kv-offloading-* turn into) and
     checks the connector each config means to run: OrbitKVConnector from orbitkv.vllm with
     kv_load_failure_policy "recompute" (dram, ssd), OffloadingConnector with the size asked for
     (offload, offload-okv), LMCacheConnectorV1 (lmcache), none (native, ceiling);
  3. for offload-okv, resolves the spec and the secondary tier through vLLM's own factories: the
     tier class must be orbitkv.vllm_tier.OrbitKVTier.
The engine itself is not built: that asks the GPU for its memory. Exit status 0 when every
config passes.
"""
import json
import os
import subprocess
import sys
import tempfile
import types

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "integration", "python"))


def argv(version: str, cfg: str) -> list:
    with tempfile.TemporaryDirectory() as d:
        env = dict(os.environ, VLLM=version, OKV_DIR=d, OUT=os.path.join(d, "out"))
        out = subprocess.run(["bash", "scripts/gpu/vllm.sh", "flags", cfg], cwd=ROOT, env=env,
                             capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def set_platform() -> None:
    """A platform for the parser's defaults, which ask it for the device type: with no GPU here
    vLLM finds none, and its CUDA platform needs libcuda to import. The CPU platform answers
    "cpu"; none of the checked flags depends on it."""
    import vllm.platforms
    from vllm.platforms.cpu import CpuPlatform

    vllm.platforms._current_platform = CpuPlatform()


def check(version: str, cfg: str) -> None:
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    try:  # 0.33 moved it out of entrypoints.openai
        from vllm.entrypoints.common.cli_args import make_arg_parser
    except ImportError:
        from vllm.entrypoints.openai.cli_args import make_arg_parser

    flags = ["--model", os.path.join(ROOT, "integration", "models", "qwen3-8b")] + argv(version, cfg)  # vllm.sh's MODEL
    args = make_arg_parser(FlexibleArgumentParser()).parse_args(flags)
    ea = AsyncEngineArgs.from_cli_args(args)
    # what VllmConfig.__post_init__ makes of the offloading flags, on the parsed values
    cache = types.SimpleNamespace(kv_offloading_size=ea.kv_offloading_size,
                                  kv_offloading_backend=ea.kv_offloading_backend)
    holder = types.SimpleNamespace(cache_config=cache, kv_transfer_config=ea.kv_transfer_config)
    VllmConfig._post_init_kv_transfer_config(holder)
    kv = holder.kv_transfer_config
    connector = kv.kv_connector if kv is not None else None
    want = {"native": None, "ceiling": None, "offload": "OffloadingConnector", "offload-okv": "OffloadingConnector",
            "lmcache": "LMCacheConnectorV1", "dram": "OrbitKVConnector", "ssd": "OrbitKVConnector"}[cfg]
    assert connector == want, f"connector {connector!r}, want {want!r}"
    if cfg == "ceiling":
        assert ea.num_gpu_blocks_override == 8192, ea.num_gpu_blocks_override
    else:
        assert ea.num_gpu_blocks_override == 1024, ea.num_gpu_blocks_override
    if cfg in ("dram", "ssd"):
        assert kv.kv_connector_module_path == "orbitkv.vllm"
        assert kv.kv_load_failure_policy == "recompute", kv.kv_load_failure_policy
        assert kv.kv_connector_extra_config["socket"] == f"/tmp/okv-{cfg}/orbitkv.sock"
        __import__(kv.kv_connector_module_path)
    if cfg in ("offload", "offload-okv"):
        gib = 16 if cfg == "offload" else 8
        assert kv.kv_connector_extra_config["cpu_bytes_to_use"] == gib << 30, kv.kv_connector_extra_config
    if cfg == "offload-okv":
        from vllm.v1.kv_offload.factory import OffloadingSpecFactory
        from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

        from orbitkv.vllm_tier import OrbitKVTier

        extra = kv.kv_connector_extra_config
        assert OffloadingSpecFactory.get_spec_cls(extra) is TieringOffloadingSpec
        ((_, cls),) = TieringOffloadingSpec._get_secondary_tiers(extra)
        assert cls is OrbitKVTier, cls
        assert extra["secondary_tiers"][0]["socket"] == "/tmp/okv-offload-okv/orbitkv.sock"


def main() -> int:
    import vllm

    version = ".".join(vllm.__version__.split(".")[:2])
    if version not in ("0.26", "0.33"):
        print(f"vllm-check: vLLM {vllm.__version__}: vllm.sh runs 0.26 and 0.33")
        return 2
    set_platform()
    cfgs = ["native", "ceiling", "offload", "lmcache", "dram", "ssd"] + (["offload-okv"] if version == "0.33" else [])
    bad = 0
    for cfg in cfgs:
        try:
            check(version, cfg)
            print(f"ok   vllm {vllm.__version__} {cfg}")
        except BaseException as e:  # SystemExit from argparse too
            bad += 1
            print(f"FAIL vllm {vllm.__version__} {cfg}: {type(e).__name__}: {e}")
    # vllm.sh refuses offload-okv on 0.26 (no secondary tiers there) before starting anything
    print(f"vllm-check: {len(cfgs) - bad} of {len(cfgs)} configs pass")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
