"""The README's vLLM command line carries every setting the connector needs
(docs/compatibility.md, "Required vLLM settings"), as one command a user can
paste."""

import json
import os
import re
import shlex

ROOT = os.path.join(os.path.dirname(__file__), "..", "..", "..")


def vllm_line():
    with open(os.path.join(ROOT, "README.md")) as f:
        lines = [l.strip() for l in f if l.strip().startswith("vllm serve ") and "OrbitKVConnector" in l]
    assert len(lines) == 1, lines
    return shlex.split(lines[0])


def test_readme_vllm_line_is_complete():
    argv = vllm_line()
    assert argv[:2] == ["vllm", "serve"] and not argv[2].startswith("-"), "names a model"
    for flag in ("--disable-hybrid-kv-cache-manager", "--enable-prefix-caching", "--block-size", "--kv-transfer-config"):
        assert flag in argv, flag
    block = int(argv[argv.index("--block-size") + 1])
    kv = json.loads(argv[argv.index("--kv-transfer-config") + 1])
    assert kv["kv_connector"] == "OrbitKVConnector"
    assert kv["kv_connector_module_path"] == "orbitkv.vllm"
    assert kv["kv_role"] == "kv_both"
    assert kv["kv_load_failure_policy"] == "recompute"
    extra = kv["kv_connector_extra_config"]
    assert os.path.isabs(extra["socket"]) and extra["socket"].endswith("orbitkv.sock")
    assert extra.get("page_tokens", 64) % block == 0
    import orbitkv.vllm  # the module path resolves to the connector class
    assert hasattr(orbitkv.vllm, kv["kv_connector"])


def test_readme_names_no_cwd_relative_socket():
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    assert not re.search(r"--socket data/", text), "a socket relative to the working directory"
