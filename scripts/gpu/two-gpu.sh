#!/bin/bash
# The two-GPU run (issue 16; docs/benchmarks.md "Two GPUs (prepared)"), on the nvidia-h200-x2
# kind: ask the device tool's `status` first and run this only when it lists that kind.
#
#   scripts/gpu/two-gpu.sh tests   topology (nvidia-smi topo -m), the cuda tests with TestPeerCopy
#                                  (GPU 0 -> GPU 1, cuMemcpyPeerAsync, bytes compared) and
#                                  BenchmarkPeerCopy (direct vs staged through pinned DRAM, 32 MiB
#                                  and an 8K prompt's 1,152 MiB), the fabric GPU tests on GPU 0 and
#                                  again on GPU 1 (CUDA_VISIBLE_DEVICES=1)            ~2.5 min
#   scripts/gpu/two-gpu.sh pd      a same-host P/D handoff through the host's one peer: prefill
#                                  engine on GPU 0, decode engine on GPU 1 (scripts/gpu/pd.sh ref,
#                                  VARIANTS="async@cuda:1 async@cuda:0": the same probe with the
#                                  decode engine on GPU 0 too, the one-GPU baseline, same run)
#                                  The peer has no GPU -> GPU page path: the pages go GPU 0 -> the
#                                  peer's DRAM -> GPU 1 (docs/pd.md "Two GPUs").          ~2 min
#   CPU=1 scripts/gpu/two-gpu.sh pd  the pd part's dry run here (pd.sh CPU=1, consumer "async@cpu")
#   scripts/gpu/two-gpu.sh         both, one device call: ~4.5 min of command time, ~6.5 min of
#                                  device time with the machine's start
#
# Carried (built here, cgo): out/orbitkv.xz, out/cuda.test.xz, out/fabric.test.xz
#   CGO_ENABLED=1 go build -ldflags="-s -w -checklinkname=0" -o out/orbitkv ./cmd/orbitkv
#   CGO_ENABLED=1 go test -c -ldflags="-s -w -checklinkname=0" -o out/cuda.test ./cuda
#   CGO_ENABLED=1 go test -c -ldflags="-s -w -checklinkname=0" -o out/fabric.test ./fabric
#   xz -kf out/orbitkv out/cuda.test out/fabric.test
# Every step has its own timeout; logs land in $OUT (summary.txt, tests.txt, bench_peer.txt and
# pd.sh's pd_*.json, peer.log, engines.log: 7 files of the 8 that come back).
set -u
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
O=${OUT:-/tmp/orbitkv-2gpu-out}
mkdir -p "$O"
S=$O/summary.txt
T=$O/tests.txt
say() { echo "== $(date +%T) $*" | tee -a "$S"; }

for b in orbitkv cuda.test fabric.test; do
	if [ -f "out/$b.xz" ] && [ ! -x "out/$b" ]; then
		python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "out/$b.xz" "out/$b" && chmod +x "out/$b"
	fi
done

tests() {
	nvidia-smi --query-gpu=index,name,driver_version,memory.total,pcie.link.gen.current --format=csv,noheader | tee -a "$S"
	nvidia-smi topo -m 2>&1 | head -8 | tee -a "$S"
	local n rc=0
	n=$(nvidia-smi --query-gpu=index --format=csv,noheader | wc -l)
	[ "$n" -ge 2 ] || say "only $n GPU(s): TestPeerCopy and BenchmarkPeerCopy will skip, the GPU 1 runs fail"
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 90 ../out/cuda.test -test.v -test.count=1) >"$T" 2>&1 || rc=1
	say "cuda tests rc=$rc ($(tail -1 "$T"))"
	grep -E -A3 "^=== RUN   TestPeerCopy|^--- (FAIL|SKIP)" "$T" | grep -E "^--- |peer_test" | tee -a "$S"
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 90 ../out/cuda.test -test.run XXX -test.bench PeerCopy -test.benchtime 10x -test.v) >"$O/bench_peer.txt" 2>&1
	local r=$?
	say "cuda BenchmarkPeerCopy rc=$r"
	[ $r = 0 ] || rc=1
	grep -E "^Benchmark|can access" "$O/bench_peer.txt" | tee -a "$S"
	for g in 0 1; do
		(cd fabric && CUDA_VISIBLE_DEVICES=$g ORBITKV_REQUIRE=cuda timeout 120 ../out/fabric.test -test.run 'GPU|CUDA|Stuck' -test.v -test.count=1) >>"$T" 2>&1
		r=$?
		say "fabric GPU tests on GPU $g (CUDA_VISIBLE_DEVICES=$g) rc=$r"
		[ $r = 0 ] || rc=1
		grep -E "^--- " "$T" | tail -8 | tee -a "$S"
	done
	return $rc
}

pd() {
	# The peer sees both GPUs: the producer's session is on device 0, the consumer's on device 1
	# (the peer opens device 1's context and transport on that first session: a path no test
	# has run on a GPU before).
	local p=cuda:0 v="async@cuda:1 async@cuda:0"
	[ "${CPU:-0}" = 1 ] && p=cpu v="async@cpu" # the dry run here: pd.sh's CPU mode, same call sequence
	P_DEVICE=$p VARIANTS="${VARIANTS:-$v}" PROBE_TIMEOUT=${PROBE_TIMEOUT:-150} \
		timeout ${PD_TIMEOUT:-280} bash scripts/gpu/pd.sh ref
	local r=$?
	say "pd.sh (prefill $p, decode $v) rc=$r"
	return $r
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
