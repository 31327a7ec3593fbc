"""vLLM V1 KV connector for OrbitKV (``kv_connector_module_path: orbitkv.vllm``)."""

from orbitkv.vllm._compat import KVConnectorRole
from orbitkv.vllm.connector import OrbitKVConnector
from orbitkv.vllm.metadata import OrbitKVMetadata

__all__ = ["KVConnectorRole", "OrbitKVConnector", "OrbitKVMetadata"]
