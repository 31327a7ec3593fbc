#!/usr/bin/env bash
# Installs the Debian packages OrbitKV's tests and benchmarks use, when missing.
# Idempotent: a second run installs nothing and takes well under a second.
set -euo pipefail

pkgs=(
  fio redis-server iperf3 iproute2 protobuf-compiler
  python3-torch python3-grpcio python3-grpc-tools python3-protobuf python3-pytest python3-numpy
  protobuf-compiler-grpc
  libibverbs-dev # only rdma's ABI test reads its verbs.h: the build declares the few verbs types itself
  python3-venv libcurl4 libibverbs1 libnuma1 # Mooncake's wheel (scripts/install-mooncake.sh) links these; ldd finds the rest in its own wheel or the base system
)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
# The partition tests (integration/e2e/pd_test.go) shape links with tc, from iproute2. Its netem
# qdisc needs the kernel's sch_netem module, which no package here can add: where it is missing
# the tests use tbf and say so.
if ! tc -V >/dev/null 2>&1 && [[ ! " ${missing[*]} " == *" iproute2 "* ]]; then
  missing+=(iproute2)
fi
[ ${#missing[@]} -eq 0 ] && exit 0

echo "install-deps: installing ${missing[*]}"
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -qq
$sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
