#!/bin/bash
# Several runs of scripts/gpu/transfer.sh in one device call, each with its own settings, to tell
# apart what holds the fetch back on the GPU machine's 16 cores (docs/benchmarks.md "On 16 cores"):
# the source's coldness (POOL), the destination's (BATCH), both warm, the Go scheduler
# (GOMAXPROCS). Every run prints its CPU lines (cores and s/GB per side, the busiest CPUs with
# their softirq share) and the memory's copy rate. SWEEP lists the runs as NAME:VAR=VALUE,...;
# SIZES, CONNS and VERIFY apply to all. Carry out/orbitkv.xz and out/netbin as for transfer.sh.
#   bash scripts/gpu/transfer-sweep.sh
set -u
export SIZES=${SIZES:-256KiB} CONNS=${CONNS:-1,2} VERIFY=${VERIFY:-inline,behind}
SWEEP=${SWEEP:-"default: pool16:POOL=16MiB pool1g:POOL=1GiB batch1:BATCH=1MiB hot:POOL=16MiB,BATCH=1MiB gmp2:GOMAXPROCS=2"}
O=${OUT:-/tmp/orbitkv-gpu-out}
mkdir -p "$O"
for run in $SWEEP; do
	name=${run%%:*} vars=${run#*:}
	echo "== $(date +%T) sweep run $name (${vars:-defaults})" | tee -a "$O/summary.txt"
	( IFS=,; for v in $vars; do [ -n "$v" ] && export "$v"; done; OUT=$O/$name bash scripts/gpu/transfer.sh ) >/dev/null 2>&1
	grep -E '^(bench transfer|memory|tcp |cpu|== .*rc=)' "$O/$name/summary.txt" | tee -a "$O/summary.txt"
done
