#!/usr/bin/env python3
"""CPU check of scripts/gpu/sglang.sh's server command lines against the real SGLang (0.5.17 or
0.5.23).

Run with an SGLang test environment (scripts/install-sglang.sh, scripts/install-sglang0523.sh),
from the repository root:

  ~/.cache/orbitkv/sglang-0.5.17/bin/python scripts/gpu/sglang-check.py
  ~/.cache/orbitkv/sglang-0.5.23/bin/python scripts/gpu/sglang-check.py

For every config the script runs (native, l2, dram, ssd, and dram with deterministic inference)
it takes the exact argv from `sglang.sh flags CONFIG` and
  1. parses it with SGLang's own argument parser (ServerArgs.add_cli_args): an unknown flag or a
     value outside a flag's choices fails here as it would on the H200;
  2. for the storage configs, reads the --hicache-storage-backend-extra-config string the way
     the server does (0.5.17: HiRadixCache._parse_storage_backend_extra_config; 0.5.23:
     HybridCacheController.parse_storage_backend_extra_config), builds SGLang's
     HiCacheStorageConfig from it and asks SGLang's StorageBackendFactory for the "dynamic"
     backend: the module and class it names must import and build our OrbitKVHiCacheStorage
     (which reads its socket from the same dict).
ServerArgs.__post_init__ is not run: it asks the GPU for its memory and capability.
Exit status 0 when every config passes.
"""
import argparse
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "integration", "python"))

from sglang.srt.server_args import ServerArgs  # noqa: E402

CONFIGS = [("native", []), ("ceiling", []), ("l2", []), ("dram", []), ("dram-h16", []), ("ssd", []),
           ("dram", ["--enable-deterministic-inference"]), ("native", ["--enable-deterministic-inference"])]


def argv_of(cfg, extra):
    out = subprocess.run([os.path.join(ROOT, "scripts/gpu/sglang.sh"), "flags", cfg, *extra],
                         check=True, capture_output=True, text=True).stdout
    return out.splitlines()


def parse(argv):
    parser = argparse.ArgumentParser(exit_on_error=False)
    ServerArgs.add_cli_args(parser)
    ns, unknown = parser.parse_known_args(argv)
    if unknown:
        raise SystemExit(f"unknown to SGLang's parser: {unknown}")
    return ns


def parse_extra_config(text):
    """The extra config as the installed SGLang's server reads it."""
    try:  # 0.5.17
        from sglang.srt.mem_cache.hiradix_cache import HiRadixCache

        return HiRadixCache._parse_storage_backend_extra_config(None, text)[0]
    except ModuleNotFoundError:  # 0.5.23: HiCache v2
        from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

        return HybridCacheController.parse_storage_backend_extra_config(text)[0]


def backend_of(ns):
    from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig
    from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory

    extra = parse_extra_config(ns.hicache_storage_backend_extra_config)
    cfg = HiCacheStorageConfig(
        tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1, is_mla_model=False,
        enable_storage_metrics=False, is_page_first_layout=ns.hicache_mem_layout == "page_first",
        model_name=ns.served_model_name, tp_lcm_size=None, should_split_heads=False, extra_config=extra)
    return StorageBackendFactory.create_backend(ns.hicache_storage_backend, cfg, None)


def main():
    failed = 0
    for cfg, extra in CONFIGS:
        name = cfg + (" " + " ".join(extra) if extra else "")
        try:
            argv = argv_of(cfg, extra)
            ns = parse(argv)
            what = (f"attention={ns.attention_backend} page={ns.page_size} max_total_tokens={ns.max_total_tokens} "
                    f"hicache={ns.enable_hierarchical_cache} deterministic={ns.enable_deterministic_inference}")
            if ns.hicache_storage_backend:
                b = backend_of(ns)
                what += (f" storage={ns.hicache_storage_backend} -> {type(b).__module__}.{type(b).__name__}"
                         f" socket={b.socket} host_gb={ns.hicache_size} layout={ns.hicache_mem_layout}")
            elif ns.enable_hierarchical_cache:
                what += f" host_gb={ns.hicache_size} (no storage)"
            print(f"ok   {name}: {len(argv)} args; {what}")
        except BaseException as e:  # argparse raises SystemExit and ArgumentError
            failed += 1
            print(f"FAIL {name}: {type(e).__name__}: {e}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
