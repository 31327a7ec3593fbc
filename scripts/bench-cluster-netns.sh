#!/bin/sh
# Catalog convergence (DESIGN.md §6 "catalog"): three peers, each in its own
# network namespace on one bridge; `orbitkv bench cluster` saves pages on the
# first and measures how long until the others' remote indexes hold them all,
# the bytes the peers sent on their devices, and the memory per remote page.
# Needs root and iproute2 (scripts/install-deps.sh). Extra arguments go to the
# bench:  scripts/bench-cluster-netns.sh --pages 100000
set -eu
BIN=${ORBITKV_BIN:-bin/orbitkv}
P=okv-bcl
DIR=$(mktemp -d /tmp/okv-bench-cluster.XXXXXX)
PIDS=

cleanup() {
  for pid in $PIDS; do kill "$pid" 2>/dev/null || true; done
  for pid in $PIDS; do while kill -0 "$pid" 2>/dev/null; do sleep 0.1; done; done
  for n in a b c sw; do ip netns del $P-$n 2>/dev/null || true; done
  ip link del $P-p0 2>/dev/null || true
  rm -rf "$DIR"
}
trap cleanup EXIT INT TERM
cleanup
mkdir -p "$DIR"
ip netns add $P-sw
ip -n $P-sw link add br0 type bridge
ip -n $P-sw link set br0 up
i=0
for n in a b c; do
  i=$((i + 1))
  ip netns add $P-$n
  ip link add $P-h$n type veth peer name $P-s$n
  ip link set $P-h$n netns $P-$n
  ip -n $P-$n link set $P-h$n name eth0
  ip -n $P-$n addr add 10.76.0.$i/24 dev eth0
  ip -n $P-$n link set eth0 up
  ip -n $P-$n link set lo up
  ip link set $P-s$n netns $P-sw
  ip -n $P-sw link set $P-s$n master br0 up
done
# This namespace reaches the peers' metrics over the bridge, as a monitor would.
ip link add $P-p0 type veth peer name $P-p1
ip link set $P-p1 netns $P-sw
ip -n $P-sw link set $P-p1 master br0 up
ip addr add 10.76.0.254/24 dev $P-p0
ip link set $P-p0 up

i=0
for n in a b c; do
  i=$((i + 1))
  join=
  [ $n = a ] || join="--cluster-join 10.76.0.1:7946"
  dram=64MiB
  [ $n = a ] && dram=768MiB # a holds the pages: 4 KiB each
  # shellcheck disable=SC2086
  ip netns exec $P-$n "$BIN" serve --data-dir "$DIR/$n" --cluster-addr 10.76.0.$i:7946 --node-name bench-$n \
    --cluster-insecure --metrics-addr 10.76.0.$i:9464 --dram-bytes $dram --ssd-bytes 0 $join 2>"$DIR/$n.log" &
  PIDS="$PIDS $!"
done
for n in a b c; do
  until [ -S "$DIR/$n/orbitkv.sock" ]; do sleep 0.1; done
done
set -- $PIDS "$@"
pa=$1 pb=$2 pc=$3
shift 3
echo "peers: bench-a (10.76.0.1), bench-b (10.76.0.2), bench-c (10.76.0.3), one bridge; binary $BIN"
"$BIN" bench cluster --sockets "$DIR/a/orbitkv.sock,$DIR/b/orbitkv.sock,$DIR/c/orbitkv.sock" \
  --metrics 10.76.0.1:9464,10.76.0.2:9464,10.76.0.3:9464 --pids "$pa,$pb,$pc" "$@"
