#!/usr/bin/env bash
# Builds the Soft-RoCE guest scripts/rdma/run.sh boots: Debian 12's own kernel
# (which has rdma_rxe as a module) and a busybox initramfs holding the modules
# rxe needs, rdma-core's userspace (libibverbs and its rxe provider) and
# iproute2's `rdma`, from the packages pinned in guest-packages.txt.
#
# Prints the guest's directory: vmlinuz and initrd.gz. Both are cached under
# $ORBITKV_CACHE/rxe (default ~/.cache/orbitkv/rxe), keyed by the sha256 of
# this script, guest-packages.txt and init: a second run prints the same
# directory at once, and a rebuild from the same pins gives the same bytes
# (sorted cpio, every mtime 0, gzip -n). The .debs (76 MB) are cached beside
# it and checked against their pinned sha256 on every build.
#
# Host needs: apt-get (Debian's index, for the download only), dpkg-deb,
# cpio, gzip. Nothing is installed on the host. Exit code 3: a package could
# not be downloaded (run.sh reports that as a skip).
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${ORBITKV_CACHE:-$HOME/.cache/orbitkv}/rxe"
key="$(cat "$here/guest.sh" "$here/guest-packages.txt" "$here/init" | sha256sum | cut -c1-16)"
out="$cache/guest-$key"
if [ -s "$out/vmlinuz" ] && [ -s "$out/initrd.gz" ]; then
  echo "$out"
  exit 0
fi

# The modules rdma_rxe needs to make rxe0 on a virtio NIC, and the virtio disk
# (ext4: the SSD tier needs O_DIRECT and fallocate, which tmpfs lacks) that
# carries payloads in and results out. crc32_generic is rxe's ICRC: without
# it `rdma link add` fails with ENOENT (the reason is a kernel warning).
modules=(virtio_pci virtio_net virtio_blk ext4 crc32c_generic crc32_generic rdma_rxe)

debs="$cache/debs"
mkdir -p "$debs"
work="$(mktemp -d "${TMPDIR:-/tmp}/orbitkv-guest.XXXXXX")"
trap 'rm -rf "$work"' EXIT

# fetch downloads each pinned package (once) and checks its sha256.
fetch() {
  local name version sum file
  while read -r name version sum; do
    case "$name" in ''|'#'*) continue ;; esac
    file="$debs/${name}_${version//:/%3a}_amd64.deb"
    if [ ! -s "$file" ]; then
      (cd "$work" && apt-get download -q "$name=$version" >/dev/null 2>&1) || {
        echo "guest.sh: apt-get download $name=$version failed (no network, or Debian dropped the version: see guest-packages.txt)" >&2
        exit 3
      }
      mv "$work/${name}_${version//:/%3a}_amd64.deb" "$file"
    fi
    if [ "$(sha256sum "$file" | cut -c1-64)" != "$sum" ]; then
      echo "guest.sh: $file does not match its pinned sha256" >&2
      rm -f "$file"
      return 1
    fi
    dpkg-deb -x "$file" "$work/pkgs"
  done < "$here/guest-packages.txt"
}

# modpath prints the path of module $1 under the kernel's tree.
modpath() {
  find "$kdir/kernel" -name "$1.ko" -o -name "${1//_/-}.ko" | head -n1
}

# moddeps prints module $1's dependencies (its .modinfo "depends=" field).
moddeps() {
  tr '\0' '\n' < "$(modpath "$1")" | sed -n 's/^depends=//p' | tr ',' ' '
}

# order prints the modules and their dependencies, each after what it needs.
declare -A seen=()
order() {
  local m d
  for m in "$@"; do
    [ -n "${seen[$m]:-}" ] && continue
    seen[$m]=1
    for d in $(moddeps "$m"); do order "$d"; done
    echo "$m"
  done
}

fetch
kdir="$(echo "$work"/pkgs/lib/modules/*)"
root="$work/root"
mkdir -p "$root"/{bin,dev,proc,sys,tmp,mnt,lib/modules,etc/libibverbs.d,lib64}
cp "$work/pkgs/bin/busybox" "$root/bin/busybox"
cp "$here/init" "$root/init"
order "${modules[@]}" | while read -r m; do
  cp "$(modpath "$m")" "$root/lib/modules/$m.ko"
  echo "$m" >> "$root/lib/modules/order"
done
# rdma-core's userspace, iproute2's rdma and the libraries they and the Go
# payloads (cgo: libc, libibverbs by dlopen) link.
mkdir -p "$root/lib/x86_64-linux-gnu/libibverbs"
for l in ld-linux-x86-64.so.2 libc.so.6 libm.so.6 libpthread.so.0 libdl.so.2 libresolv.so.2 \
  libibverbs.so.1 libnl-3.so.200 libnl-route-3.so.200 libmnl.so.0 libbsd.so.0 libmd.so.0 libcap.so.2; do
  # Debian 12 splits these between /lib and /usr/lib: take the file the link names.
  src="$(ls "$work"/pkgs/{,usr/}lib/x86_64-linux-gnu/"$l" 2>/dev/null | head -n1 || true)"
  [ -n "$src" ] || { echo "guest.sh: no $l in the pinned packages" >&2; exit 1; }
  cp -L "$src" "$root/lib/x86_64-linux-gnu/$l"
done
ulib="$work/pkgs/usr/lib/x86_64-linux-gnu"
cp -a "$ulib"/libibverbs/librxe-rdmav34.so "$root/lib/x86_64-linux-gnu/libibverbs/"
cp "$work/pkgs/etc/libibverbs.d/rxe.driver" "$root/etc/libibverbs.d/"
ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$root/lib64/ld-linux-x86-64.so.2"
mkdir -p "$root/usr" && ln -s ../lib "$root/usr/lib"
cp "$work/pkgs/usr/bin/rdma" "$root/bin/rdma"

mkdir -p "$work/out"
cp "$work"/pkgs/boot/vmlinuz-* "$work/out/vmlinuz"
(cd "$root" && find . -print0 | LC_ALL=C sort -z | xargs -0 touch -h -d @0 &&
  find . -print0 | LC_ALL=C sort -z | cpio --null --create --format=newc --reproducible --quiet) |
  gzip -n -9 > "$work/out/initrd.gz"
mkdir -p "$cache"
rm -rf "$out" && mv "$work/out" "$out"
find "$cache" -maxdepth 1 -name 'guest-*' ! -path "$out" -exec rm -rf {} + # guests of older inputs
echo "$out"
