#!/bin/sh
# What each Soft-RoCE guest runs (scripts/rdma/run.sh copies it onto the
# guest's disk as /mnt/payload/run.sh; the guest's /init runs it with the
# guest's role, a or b, and keeps its output and exit code in /mnt/results).
# Every payload has its own deadline; each one's exit code goes to
# /mnt/results/summary as "name rc seconds", and the script fails if one did.
cd /mnt/payload
export ORBITKV_REQUIRE=rdma ORBITKV_RDMA_DEVICES=rxe0,rxe1 ORBITKV_BIN=/mnt/payload/orbitkv
export ORBITKV_RXE_CERTS=/mnt/payload/certs
failed=0

# run NAME DEADLINE COMMAND...: one payload, its log in /mnt/results/NAME.log.
run() {
  name=$1 deadline=$2
  shift 2
  start=$(cut -d. -f1 /proc/uptime)
  echo "payload: $name (deadline $deadline)"
  timeout -s KILL "$deadline" "$@" > "/mnt/results/$name.log" 2>&1
  rc=$?
  echo "$name $rc $(( $(cut -d. -f1 /proc/uptime) - start ))" | tee -a /mnt/results/summary
  [ "$rc" -eq 0 ] || failed=1
  sync
}

case "$1" in
a)
  # One guest, its two rxe devices in loopback: the rdma package's tests
  # (TestRealVerbsLoopback: two engines striping over rxe0 and rxe1), then transfer/rdma's
  # contract through the real binding: -rdmatest.library=system runs a
  # stand-in scenario in the test's process over the real libibverbs.
  run rdma 300 ./rdma.test -test.v -test.count=1 -test.timeout=280s
  run transfer-rdma-contract 300 ./transfer-rdma.test -rdmatest.library=system -test.v -test.count=1 \
    -test.timeout=280s -test.run '^TestContractOverStandIn$'
  # Two peers in one process (fabric), over rxe0 and rxe1 in loopback: the
  # exchange over mutual TLS, a load placed by PlacePages and moved by RDMA
  # READ, SSD pages over TCP, a page corrupted in the member's DRAM
  # rejected, a lease never released ending at its deadline, QPs forced
  # into the error state on either end (TCP in the same call or the
  # batch's deadline, then RDMA again).
  run fabric-cluster 300 ./fabric.test -rdmatest.library=system -test.v -test.count=1 \
    -test.timeout=280s -test.run '^TestClusterExchangesRDMAOverStandIn$'
  run two-guests 600 env ORBITKV_RXE_ROLE=a ./e2e.test -test.v -test.count=1 -test.timeout=580s \
    -test.run '^TestTwoGuestsOverRealVerbs$'
  ;;
b)
  run two-guests 840 env ORBITKV_RXE_ROLE=b ./e2e.test -test.v -test.count=1 -test.timeout=820s \
    -test.run '^TestTwoGuestsOverRealVerbs$'
  ;;
*)
  echo "payload: unknown role '$1'"
  exit 2
  ;;
esac
exit $failed
