#!/bin/sh
# Regenerates the committed Python gRPC stubs in orbitkv/_proto from
# proto/orbitkv/v1/*.proto. Messages come from the system protoc (3.21,
# matching Debian's python3-protobuf 4.21); services from Debian's
# grpc_python_plugin (package protobuf-compiler-grpc), or grpc_tools when the
# plugin is absent. Imports are rewritten to be package-relative so the stubs
# live inside the orbitkv package.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out="$here/orbitkv/_proto"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

protos="orbitkv/v1/engine.proto orbitkv/v1/admin.proto"
protoc -I "$root/proto" --python_out="$tmp" $protos
if command -v grpc_python_plugin >/dev/null 2>&1; then
  protoc -I "$root/proto" --plugin=protoc-gen-grpc_python="$(command -v grpc_python_plugin)" \
    --grpc_python_out="$tmp" $protos
else
  /usr/bin/python3 -m grpc_tools.protoc -I "$root/proto" --grpc_python_out="$tmp" $protos
fi

for f in "$tmp"/orbitkv/v1/*.py; do
  sed -e 's/^from orbitkv\.v1 import /from . import /' "$f" > "$out/$(basename "$f")"
done
echo "generated: $(cd "$out" && ls *_pb2*.py | tr '\n' ' ')"
