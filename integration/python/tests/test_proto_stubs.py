"""The committed Python stubs (orbitkv/_proto, gen_proto.sh) describe the
messages proto/orbitkv/v1/*.proto defines now: a field added to a .proto
without regenerating the stubs fails here (admin_pb2 once lacked
PeerInfo.transport for a whole session). Compares protoc's descriptors of
the .proto files with the ones embedded in the stubs; needs protoc
(scripts/install-deps.sh installs it) and skips without it."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from orbitkv._proto import admin_pb2, engine_pb2

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
STUBS = {"orbitkv/v1/engine.proto": engine_pb2, "orbitkv/v1/admin.proto": admin_pb2}


def _without_json_names(fd):
    """protoc's descriptor sets carry json_name, the embedded ones do not."""
    def strip(msgs):
        for m in msgs:
            for f in m.field:
                f.ClearField("json_name")
            strip(m.nested_type)
    strip(fd.message_type)
    return fd


@pytest.mark.skipif(shutil.which("protoc") is None, reason="protoc is not installed (scripts/install-deps.sh installs it)")
def test_committed_stubs_match_the_protos(tmp_path):
    from google.protobuf import descriptor_pb2

    out = tmp_path / "set.pb"
    subprocess.run(["protoc", "-I", os.path.join(ROOT, "proto"), f"--descriptor_set_out={out}", *STUBS],
                   check=True, timeout=60)
    want = descriptor_pb2.FileDescriptorSet()
    want.ParseFromString(out.read_bytes())
    assert sorted(f.name for f in want.file) == sorted(STUBS)
    for fd in want.file:
        got = descriptor_pb2.FileDescriptorProto()
        got.ParseFromString(STUBS[fd.name].DESCRIPTOR.serialized_pb)
        assert _without_json_names(got) == _without_json_names(fd), \
            f"{fd.name}: orbitkv/_proto is stale; run integration/python/gen_proto.sh"
