#!/bin/bash
# The same-host GPU -> GPU handoff (issue 16; docs/journal/2026-12-01-pd-handoff.md "Same-host handoff GPU to GPU"):
# on the nvidia-h200-x2 kind the producer is on GPU 0 and the consumer on GPU 1 (NVLink); on one
# GPU (nvidia-h200) the consumer is a second process on GPU 0 and every "GPU 1" below reads GPU 0
# (HBM to HBM through the peer's stage). The script looks at nvidia-smi and says which it ran.
#
#   scripts/gpu/two-gpu.sh tests   topology, the cuda tests (TestPeerCopy: GPU 0 -> GPU 1, skips on
#                                  one GPU; TestStartPeerSegments: scattered device-to-device
#                                  copies, kernel and copy engines, bytes compared), BenchmarkPeerCopy
#                                  (two GPUs: direct vs staged through pinned DRAM), the fabric GPU
#                                  tests on each GPU (TestGPUStagedHandoff among them: a save on
#                                  GPU 0, a load on the consumer's GPU from the HBM stage, every
#                                  plane compared by digest), and BenchmarkGPUHandoff (an 8K-token
#                                  Qwen3-8B prompt, 1,152 MiB: save and load through DRAM and
#                                  through the stage, beside contiguous h2d and d2d copies)  ~1.5 min
#   scripts/gpu/two-gpu.sh pd      the P/D probe (scripts/gpu/pd.sh ref: reference engines, an 8K
#                                  prompt, prefill / handoff / recompute) twice in one call: the
#                                  peer without a stage (pages GPU 0 -> DRAM -> consumer's GPU) and
#                                  with --hbm-stage-bytes 4GiB (GPU to GPU); PD_TAG dram / stage
#                                  name their pd_*.json                                    ~1 min
#   CPU=1 scripts/gpu/two-gpu.sh pd  the pd part's dry run here (pd.sh CPU=1, consumer "async@cpu",
#                                  no stage: a CPU peer has none)
#   scripts/gpu/two-gpu.sh         both, one device call: on one H200 (2026-12-03) tests took 89 s
#                                  and pd 64 s of command time, ~4 min of device time with the start
#
# Carried (built here, cgo): out/orbitkv.xz, out/cuda.test.xz, out/fabric.test.xz
#   CGO_ENABLED=1 go build -ldflags="-s -w -checklinkname=0" -o out/orbitkv ./cmd/orbitkv
#   CGO_ENABLED=1 go test -c -ldflags="-s -w -checklinkname=0" -o out/cuda.test ./cuda
#   CGO_ENABLED=1 go test -c -ldflags="-s -w -checklinkname=0" -o out/fabric.test ./fabric
#   xz -kf out/orbitkv out/cuda.test out/fabric.test
# Every step has its own timeout; logs land in $OUT: summary.txt, tests.txt, bench.txt and pd.sh's
# pd_ref_dram-*.json, pd_ref_stage-*.json, peer.log, engines.log (7 files of the 8 that come back).
set -u
. "$(dirname "$0")/lib.sh"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
O=${OUT:-/tmp/orbitkv-2gpu-out}
mkdir -p "$O"
S=$O/summary.txt
T=$O/tests.txt
B=$O/bench.txt

unxz_bins orbitkv cuda.test fabric.test

GPUS=1
[ "${CPU:-0}" = 1 ] || GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
CONS=0 # the consumer's GPU
[ "$GPUS" -ge 2 ] && CONS=1

tests() {
	nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.current --format=csv,noheader | tee -a "$S"
	nvidia-smi topo -m 2>&1 | head -8 | tee -a "$S"
	local g r rc=0
	[ "$GPUS" -ge 2 ] || say "one GPU: the consumer runs on GPU 0 too; TestPeerCopy and BenchmarkPeerCopy skip"
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 120 ../out/cuda.test -test.v -test.count=1) >"$T" 2>&1 || rc=1
	say "cuda tests rc=$rc ($(tail -1 "$T"))"
	grep -E "^--- (FAIL|SKIP)|^    --- |peer_test.go" "$T" | head -20 | tee -a "$S"
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 90 ../out/cuda.test -test.run XXX -test.bench PeerCopy -test.benchtime 10x -test.v) >"$B" 2>&1
	r=$?
	say "cuda BenchmarkPeerCopy rc=$r"
	[ $r = 0 ] || rc=1
	grep -E "^Benchmark|can access" "$B" | tee -a "$S"
	for g in $(seq 0 $((GPUS - 1))); do
		(cd fabric && CUDA_VISIBLE_DEVICES=$g ORBITKV_REQUIRE=cuda timeout 150 ../out/fabric.test -test.run 'GPU|CUDA|Stuck' -test.v -test.count=1) >>"$T" 2>&1
		r=$?
		say "fabric GPU tests on GPU $g alone (CUDA_VISIBLE_DEVICES=$g) rc=$r"
		[ $r = 0 ] || rc=1
		grep -E "^--- " "$T" | tail -9 | tee -a "$S"
	done
	if [ "$GPUS" -ge 2 ]; then # both GPUs visible: the staged handoff GPU 0 -> GPU 1
		(cd fabric && ORBITKV_REQUIRE=cuda timeout 120 ../out/fabric.test -test.run 'StagedHandoff' -test.v -test.count=1) >>"$T" 2>&1
		r=$?
		say "fabric TestGPUStagedHandoff with both GPUs rc=$r"
		[ $r = 0 ] || rc=1
	fi
	grep -E "hbmstage_gpu_test.go" "$T" | tee -a "$S"
	(cd fabric && ORBITKV_REQUIRE=cuda timeout 180 ../out/fabric.test -test.run XXX -test.bench GPUHandoff -test.benchtime 3x -test.v) >>"$B" 2>&1
	r=$?
	say "fabric BenchmarkGPUHandoff (producer GPU 0, consumer GPU $CONS) rc=$r"
	[ $r = 0 ] || rc=1
	grep -E "^BenchmarkGPUHandoff|hbmstage_gpu_test" "$B" | tee -a "$S"
	return $rc
}

pd() {
	# One peer sees every GPU: the producer's session is on device 0, the consumer's on $CONS.
	local p=cuda:0 v="async@cuda:$CONS" r rc=0
	if [ "${CPU:-0}" = 1 ]; then # the dry run here: pd.sh's CPU mode, same call sequence, no stage
		P_DEVICE=cpu VARIANTS="async@cpu" PD_TAG=dram PROBE_TIMEOUT=${PROBE_TIMEOUT:-150} timeout ${PD_TIMEOUT:-280} bash scripts/gpu/pd.sh ref
		r=$?
		say "pd.sh CPU dry run rc=$r"
		return $r
	fi
	for tag in dram stage; do
		local flags=""
		[ $tag = stage ] && flags="--hbm-stage-bytes 4GiB"
		P_DEVICE=$p VARIANTS="${VARIANTS:-$v}" PD_TAG=$tag PEER_FLAGS="$flags" PROBE_TIMEOUT=${PROBE_TIMEOUT:-150} \
			timeout ${PD_TIMEOUT:-200} bash scripts/gpu/pd.sh ref
		r=$?
		say "pd.sh $tag (prefill $p, decode $v, peer flags '${flags}') rc=$r"
		[ $r = 0 ] || rc=1
		pkill -f "orbitkv serve" 2>/dev/null
		sleep 2
	done
	return $rc
}

rc=0
for m in "${@:-tests pd}"; do
	for mm in $m; do
		case $mm in
		tests | pd) $mm || rc=1 ;;
		*) echo "usage: $0 [tests] [pd]" >&2; exit 2 ;;
		esac
	done
done
exit $rc
