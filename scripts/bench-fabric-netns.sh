#!/bin/sh
# Page fetches over the TCP data plane between two "hosts" — network
# namespaces joined by a veth pair — beside iperf3 on the same link, in the
# same run, their rounds interleaved (DESIGN.md §6 "fabric"). Needs root, iproute2 and iperf3
# (scripts/install-deps.sh). Extra arguments go to the fetching side:
#   scripts/bench-fabric-netns.sh --page-bytes 9437184 --pages 64 --batch 8
set -eu
BIN=${ORBITKV_BIN:-bin/orbitkv}
A=okv-bench-a
B=okv-bench-b
PAGE_BYTES=2097152
PAGES=256
STREAMS=1
prev_arg=
for arg in "$@"; do # the server holds the pages the client asks for
  case "$prev_arg" in
    --page-bytes) PAGE_BYTES=$arg ;;
    --pages) PAGES=$arg ;;
    --streams) STREAMS=$arg ;;
  esac
  prev_arg=$arg
done

cleanup() {
  if [ -n "${SRV:-}" ]; then kill "$SRV" 2>/dev/null || true; fi
  for p in ${IPERF:-}; do kill "$p" 2>/dev/null || true; done
  ip netns del $A 2>/dev/null || true
  ip netns del $B 2>/dev/null || true
}
trap cleanup EXIT INT TERM
cleanup
ip netns add $A
ip netns add $B
ip link add okv-bench-va type veth peer name okv-bench-vb
ip link set okv-bench-va netns $A
ip link set okv-bench-vb netns $B
ip -n $A addr add 10.77.0.1/24 dev okv-bench-va
ip -n $B addr add 10.77.0.2/24 dev okv-bench-vb
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set okv-bench-va up
ip -n $B link set okv-bench-vb up

IPERF= # one iperf3 server per stream (ports 5201, 5202, …): the baseline runs one process per stream too
i=0
while [ $i -lt "$STREAMS" ]; do
  ip netns exec $A iperf3 -s -B 10.77.0.1 -p $((5201 + i)) >/dev/null 2>&1 &
  IPERF="$IPERF $!"
  i=$((i + 1))
done
ip netns exec $A "$BIN" bench fabric --serve 10.77.0.1:7948 --page-bytes "$PAGE_BYTES" --pages "$PAGES" &
SRV=$!
sleep 2
echo "link: veth between network namespaces $A (10.77.0.1) and $B (10.77.0.2)"
ip netns exec $B "$BIN" bench fabric --fetch 10.77.0.1:7948 --iperf3 10.77.0.1 "$@"
