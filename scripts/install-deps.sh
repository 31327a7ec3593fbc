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
  g++ ninja-build python3-dev libssl-dev # SGLang (0.5.17 and 0.5.23) compiles its page hash, a torch C++ extension, at first use
)

# make test-rdma (scripts/rdma/run.sh) boots Soft-RoCE guests under qemu (TCG: no KVM
# needed), packs their initramfs with cpio and makes and reads their disks with e2fsprogs.
# Optional: where they cannot be installed, test-rdma skips, saying so (ORBITKV_REQUIRE=rdma
# makes that a failure). Debian 12's own qemu (7.2); the guest's packages are pinned apart
# (scripts/rdma/guest-packages.txt).
rdma_pkgs=(qemu-system-x86 cpio e2fsprogs)

sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
export DEBIAN_FRONTEND=noninteractive
updated=""

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
if [ ${#missing[@]} -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  $sudo apt-get update -qq && updated=1
  $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

missing=()
for p in "${rdma_pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "install-deps: installing ${missing[*]} (for make test-rdma)"
if ! { [ -n "$updated" ] || $sudo apt-get update -qq; } ||
  ! $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null; then
  echo "install-deps: ${missing[*]} could not be installed: make test-rdma will skip"
fi
