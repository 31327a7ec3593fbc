#!/usr/bin/env bash
# OrbitKV over a real verbs stack: the kernel's Soft-RoCE driver (rdma_rxe)
# and rdma-core's libibverbs, in two qemu guests joined by two qemu socket
# links, as two hosts with two NICs each on two segments would be
# (`make test-rdma`; docs/rdma.md, "What has run, and where"). Each guest
# has rxe0 on eth0 (192.168.78.x) and rxe1 on eth1 (192.168.79.x); guest a's
# netdevs have an MTU of 9000 (rxe: 4096), guest b's 1500 (rxe: 1024), so
# the two ends of every connection differ.
#
#   guest a (.1): the rdma package's tests with ORBITKV_REQUIRE=rdma
#     (TestRealVerbsLoopback: two engines striping over rxe0 and rxe1), the
#     transfer contract and two peers in one process (fabric; a QP forced
#     into the error state, a page corrupted in the member's DRAM) through
#     the real binding, then `orbitkv serve` saving pages for guest b;
#   guest b (.2): `orbitkv serve` joining a over mutual TLS, loading a's
#     pages by RDMA READ striped over both devices, every byte checked;
#     then the faults, driven from b through a control port of a's half:
#     a's links down while b READs, then back (the lane reconnects, RDMA
#     READ works again), and a's peer SIGKILLed while b READs. Both peers
#     must log a RoCE v2 GID and a path MTU of 1024 (the smaller end's).
#
# Each guest boots once (scripts/rdma/guest.sh builds and caches it) and runs
# all its payloads (scripts/rdma/payload.sh) from a disk made here, which
# brings the results back: each payload's log and exit code, the guest's
# console, in $ORBITKV_RXE_OUT (default /tmp/orbitkv-rxe). Everything has a
# deadline: a guest still running after RXE_DEADLINE seconds is killed and
# the run fails. The disks and test binaries are removed at the end.
#
# No qemu here: the run skips, saying so; ORBITKV_REQUIRE=rdma makes that a
# failure. No KVM is assumed: qemu runs under TCG (about 15 s to boot).
set -euo pipefail

cd "$(dirname "$0")/../.."
here=scripts/rdma
out="${ORBITKV_RXE_OUT:-/tmp/orbitkv-rxe}"
deadline="${RXE_DEADLINE:-1200}"
GO="${GO:-go}"

skip() {
  if [[ "${ORBITKV_REQUIRE:-}" == *rdma* ]]; then
    echo "test-rdma: FAIL: ORBITKV_REQUIRE=rdma but $1" >&2
    exit 1
  fi
  echo "test-rdma: skipped: $1"
  exit 0
}
command -v qemu-system-x86_64 >/dev/null || skip "no qemu-system-x86_64 (scripts/install-deps.sh installs qemu-system-x86)"
for tool in cpio mkfs.ext4 debugfs apt-get dpkg-deb; do
  command -v "$tool" >/dev/null || skip "no $tool (scripts/install-deps.sh installs it)"
done

start=$SECONDS
work="$(mktemp -d "${TMPDIR:-/tmp}/orbitkv-rxe.XXXXXX")"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

guest="$("$here/guest.sh")" || {
  rc=$?
  [ $rc -eq 3 ] && skip "the guest's packages could not be downloaded (scripts/rdma/guest.sh said why)"
  exit $rc
}
echo "test-rdma: guest $guest ($((SECONDS - start)) s)"

# The payloads: test binaries and the peer, built here (cgo, as shipped).
payload="$work/root/payload"
mkdir -p "$payload"
"$GO" build -ldflags=-checklinkname=0 -o "$payload/orbitkv" ./cmd/orbitkv
"$GO" test -ldflags=-checklinkname=0 -c -o "$payload/rdma.test" ./rdma
"$GO" test -ldflags=-checklinkname=0 -c -o "$payload/transfer-rdma.test" ./transfer/rdma
"$GO" test -ldflags=-checklinkname=0 -c -o "$payload/e2e.test" ./integration/e2e
"$GO" test -ldflags=-checklinkname=0 -c -o "$payload/fabric.test" ./fabric
cp "$here/payload.sh" "$payload/run.sh"
# The cluster's credentials: one CA, a certificate per guest.
"$payload/orbitkv" pki init --dir "$payload/certs" >/dev/null
for i in 0 1; do
  "$payload/orbitkv" pki issue --dir "$payload/certs" --name "host-$(printf "\\x$((61 + i))")" \
    --hosts "192.168.78.$((i + 1))" >/dev/null
done
echo "test-rdma: payloads built ($((SECONDS - start)) s)"

# disk ROLE: the guest's ext4 disk, holding the payloads (and, as the SSD
# tier needs, a file system with O_DIRECT and fallocate). Sparse.
disk() {
  truncate -s 2G "$work/$1.img"
  mkfs.ext4 -q -F -d "$work/root" -L "orbitkv-$1" "$work/$1.img"
}

# boot ROLE N MTU NETDEV0 NETDEV1: one guest under TCG, host N (1 or 2) of
# both segments, its console in $work/ROLE.console.
boot() {
  local role=$1 n=$2 mtu=$3
  qemu-system-x86_64 -accel tcg,thread=multi -cpu max -smp 2 -m 1024 \
    -display none -monitor none -no-reboot -serial "file:$work/$role.console" \
    -kernel "$guest/vmlinuz" -initrd "$guest/initrd.gz" \
    -append "console=ttyS0 panic=-1 loglevel=4 orbitkv.ip0=192.168.78.$n/24 orbitkv.ip1=192.168.79.$n/24 orbitkv.mtu=$mtu orbitkv.role=$role" \
    -drive "file=$work/$role.img,if=virtio,format=raw" \
    -netdev "socket,id=n0,$4" -device "virtio-net-pci,netdev=n0,mac=52:54:00:78:00:0$n" \
    -netdev "socket,id=n1,$5" -device "virtio-net-pci,netdev=n1,mac=52:54:00:79:00:0$n" &
  pids+=($!)
}

disk a
disk b
# a listens on two ports below the ephemeral range; a port taken meanwhile (qemu a ends
# at once: "Address already in use") is tried again with another pair.
listening() { ss -Hltn "sport = :$1" | grep -q . && ss -Hltn "sport = :$(($1 + 1))" | grep -q .; }
for attempt in 1 2 3 4 5; do
  port=$((20000 + RANDOM % 12000))
  boot a 1 9000 "listen=127.0.0.1:$port" "listen=127.0.0.1:$((port + 1))"
  # b connects once a's ends listen (a probe would take a link's one connection).
  for _ in $(seq 100); do
    listening "$port" && break
    kill -0 "${pids[-1]}" 2>/dev/null || break
    sleep 0.1
  done
  listening "$port" && break
  echo "test-rdma: guest a could not listen on 127.0.0.1:$port/$((port + 1)) (try $attempt)"
  kill "${pids[-1]}" 2>/dev/null; wait "${pids[-1]}" 2>/dev/null
  unset 'pids[-1]'
done
listening "$port" || { echo "test-rdma: guest a never listened" >&2; exit 1; }
boot b 2 1500 "connect=127.0.0.1:$port" "connect=127.0.0.1:$((port + 1))"
echo "test-rdma: guests booting (links on 127.0.0.1:$port and $((port + 1)), deadline ${deadline} s)"

# Each guest powers off when its payloads end; one still running at the
# deadline is killed.
status=0
end=$((SECONDS + deadline))
while [ $SECONDS -lt $end ] && { kill -0 "${pids[0]}" || kill -0 "${pids[1]}"; } 2>/dev/null; do
  sleep 1
done
roles=(a b)
for i in 0 1; do
  if kill -0 "${pids[$i]}" 2>/dev/null; then
    echo "test-rdma: guest ${roles[$i]} still running at the deadline (${deadline} s): killed"
    kill -KILL "${pids[$i]}"
    status=1
  fi
  wait "${pids[$i]}" || { echo "test-rdma: guest ${roles[$i]}: qemu exited with $?"; status=1; }
done
pids=()
echo "test-rdma: guests stopped ($((SECONDS - start)) s)"

# Results: each guest's /results and console, into $out.
rm -rf "$out" && mkdir -p "$out"
for role in a b; do
  # A guest killed at the deadline left its journal unreplayed: e2fsck replays it.
  e2fsck -fy "$work/$role.img" >/dev/null 2>&1 || true
  debugfs -R "rdump /results $work" "$work/$role.img" >/dev/null 2>&1 || true
  if [ -d "$work/results" ]; then mv "$work/results" "$out/$role"; else mkdir -p "$out/$role"; fi
  cp "$work/$role.console" "$out/$role/console.log"
  rc="$(cat "$out/$role/rc" 2>/dev/null || echo none)"
  echo "test-rdma: guest $role: payload exit $rc"
  sed 's/^/  /' "$out/$role/summary" 2>/dev/null || true
  if [ "$rc" != 0 ]; then
    status=1
    for log in "$out/$role"/*.log; do
      grep -qE '^(--- FAIL|FAIL|panic:)|init: failed' "$log" 2>/dev/null || [ "$(basename "$log")" = console.log ] || continue
      echo "--- $log (last 40 lines)"
      tail -n 40 "$log"
    done
  fi
done
grep -h -E 'host-b loaded|uses GID|path MTU|striped|--- (PASS|FAIL|SKIP): TestRealVerbs|--- (PASS|FAIL): Test(Contract|ClusterExchanges|TwoGuests)' "$out"/*/*.log 2>/dev/null | sed 's/^ */  /' || true
echo "test-rdma: $([ $status = 0 ] && echo PASS || echo FAIL) in $((SECONDS - start)) s; logs in $out"
exit $status
