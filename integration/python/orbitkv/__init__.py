"""OrbitKV engine adapters: page keys, the peer client, KV buffer
description, the restore admission gate, the vLLM V1 KV connector and the
SGLang HiCache storage backend.

Importing the package is cheap: grpc and torch are imported by the
submodules that need them (``client``, ``buffers``, ``vllm``, ``sglang``).
"""

__version__ = "0.1.0"
