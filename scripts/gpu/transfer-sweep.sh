#!/bin/bash
# Several runs of scripts/gpu/transfer.sh in one device call, each with its own settings, to tell
# apart what holds the fetch back on the GPU machine's 16 cores (docs/journal/2026-11-30-tcp-data-plane.md "On 16 cores",
# "Reading ahead of the writer"). Every run prints its CPU lines (cores and s/GB per side, the
# busiest CPUs with their softirq share) and the memory's copy rate. SWEEP lists the runs, separated
# by spaces, each NAME:VAR=VALUE;VAR=VALUE… (a value may hold commas: x:SIZES=2MiB;CONNS=1,2,4);
# SIZES, CONNS and VERIFY set in the environment apply to every run that does not set its own.
# Each run's whole output is in $OUT/NAME/summary.txt; the summary keeps the table and CPU lines.
# Carry out/orbitkv.xz and out/netbin as for transfer.sh.
#   bash scripts/gpu/transfer-sweep.sh
set -u
export SIZES=${SIZES:-256KiB} CONNS=${CONNS:-1,2} VERIFY=${VERIFY:-inline,behind}
SWEEP=${SWEEP:-"default: pool16:POOL=16MiB pool1g:POOL=1GiB batch1:BATCH=1MiB hot:POOL=16MiB;BATCH=1MiB gmp2:GOMAXPROCS=2"}
O=${OUT:-/tmp/orbitkv-gpu-out}
mkdir -p "$O"
for run in $SWEEP; do
	name=${run%%:*} vars=${run#*:}
	echo "== $(date +%T) sweep run $name (${vars:-defaults})" | tee -a "$O/summary.txt"
	(
		IFS=';'
		for v in $vars; do
			case $v in
			[A-Z]*=*) export "$v" ;;
			'') ;;
			*) echo "sweep run $name: not VAR=VALUE: $v"; exit 2 ;;
			esac
		done
		OUT=$O/$name bash scripts/gpu/transfer.sh >/dev/null 2>&1
	) || { echo "sweep run $name: failed (rc $?)" | tee -a "$O/summary.txt"; continue; }
	grep -E '^(bench transfer|memory|tcp |stream |cpu|== .*rc=)' "$O/$name/summary.txt" | tee -a "$O/summary.txt"
done
