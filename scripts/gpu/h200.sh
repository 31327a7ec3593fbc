#!/bin/bash
# GPU runs (docs/journal/2026-11-30-gpu-h200.md, "GPU"), one device call per part:
#   scripts/gpu/h200.sh check      GPU tests (Go peer + cuda, Python), bench gpu, TTFT probe, proto check
#   scripts/gpu/h200.sh sustained  the seeds' sustained workload: native, DRAM, SSD (CONFIGS=…), runs named
#                                  CONFIG-PAIR (PAIR, ORDER label them) kept in /root/okv/ref-runs across the
#                                  calls of a warm machine, bench report over all of them after each call:
#                                  PAIR=1 ORDER=AB CONFIGS="native dram ssd", then PAIR=2 ORDER=BA CONFIGS="ssd dram native"
#   scripts/gpu/h200.sh invariant  batch-invariant mode (exact attention, token tiles): its CUDA test, sustained
#                                  native/DRAM/SSD (0 mismatches expected), and the corrupted-restore control
#   scripts/gpu/h200.sh peer       bench gpu's through-the-peer rows, 1 vs 4 copiers, TTFT with 8K-token steps
#   scripts/gpu/h200.sh peer128    8K-token peer rows only (64- and 16-token blocks), then the Go GPU tests
#   scripts/gpu/h200.sh pitched    copy methods incl. pitched 2D copies: cuda tests, method table and peer rows
#                                  (auto, then each of ${PEER_METHODS:-kernel}) with phase times, fabric GPU tests
#                                  with the peer on each of ${TEST_METHODS:-auto kernel}, the peer's CPU benchmarks
#   scripts/gpu/h200.sh layerwise  layer-wise load: its GPU tests, TTFT layer-wise vs the old path in one run,
#                                  then sustained native vs DRAM (layer-wise) with ${DURATION:-30s} windows
#   scripts/gpu/h200.sh lwmethods  layer-wise TTFT only, instrumented (--trace, peer enqueue histograms), once per
#                                  peer copy method in ${METHODS:-kernel batch} (peer --cuda-method)
#   scripts/gpu/h200.sh lwgates    gated layer-wise loads: gate GPU tests, then TTFT gated (copy engines, the default)
#                                  vs ungated kernel (--cuda-method kernel --cuda-layer-gates=false), one run
#   scripts/gpu/h200.sh final      every GPU test (cuda, transfer, fabric), the 8K-token peer rows, one gated TTFT probe
#   scripts/gpu/h200.sh refengine  refengine GPU tests, TTFT probe + decode bench; with BASE=DIR (a copy of
#                                  integration/python from another commit) the same probes on it first-hand
#   scripts/gpu/h200.sh steps      issue 11, decode near the floor: refengine CUDA tests (decode graphs included),
#                                  then prefill/decode step times eager vs CUDA graphs at batch 1 and 8 beside the
#                                  weight-read floor (sdpa), and exact mode at batch 8; Python only, no binaries
# Binaries come prebuilt (cgo, dlopen'd libcuda) in out/: orbitkv (or orbitkv.xz), fabric.test, cuda.test, transfer.test.
# Every step has its own timeout; logs land in $OUT (at most 8 files come back).
set -u
. "$(dirname "$0")/lib.sh"
export NCCL_NVLS_ENABLE=0 PYTHONUNBUFFERED=1
O=${OUT:-/tmp/orbitkv-gpu-out}
mkdir -p "$O"
ROOT=$(pwd)
S=$O/summary.txt
PEER_PID=""
ENGINE_PID=""
stop_all() { # the engine first, the peer last
	[ -n "$ENGINE_PID" ] && stop_groups "$ENGINE_PID"
	[ -n "$PEER_PID" ] && stop_groups "$PEER_PID"
	ENGINE_PID="" PEER_PID=""
}
trap stop_all EXIT

start_peer() { # DIR LOG ARGS...
	local dir=$1 log=$2
	shift 2
	rm -rf "$dir"
	# PEER_FLAGS (e.g. --ssd-readmit-all) go to every peer; sustained runs are labelled peer_flags=...
	env ${PEER_ENV:-} out/orbitkv serve --data-dir "$dir" --cuda require --metrics-addr 127.0.0.1:9464 "$@" ${PEER_FLAGS:-} >>"$log" 2>&1 &
	PEER_PID=$!
	wait_socket "$dir/orbitkv.sock" "$PEER_PID" 600
}

check() {
	nvidia-smi --query-gpu=name,driver_version,memory.total,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader | tee -a "$S"
	python3 -c "import sys; sys.path.insert(0,'integration/python'); from orbitkv._proto import engine_pb2, engine_pb2_grpc, admin_pb2; print('proto ok')" >"$O/proto.txt" 2>&1
	python3 -c "import google.protobuf, grpc, torch; print('protobuf', google.protobuf.__version__, 'grpcio', grpc.__version__, 'torch', torch.__version__)" >>"$O/proto.txt" 2>&1
	say "proto import: $(head -1 "$O/proto.txt") ($(tail -1 "$O/proto.txt"))"

	T=$O/tests.txt
	(cd fabric && ORBITKV_REQUIRE=cuda timeout 150 ../out/fabric.test -test.run 'GPU|CUDA' -test.v -test.count=1) >"$T" 2>&1
	say "fabric GPU tests rc=$?"
	grep -E "^\s*(--- |FAIL|PASS|ok)|gpu_test.go" "$T" | head -30 | tee -a "$S"
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 150 ../out/cuda.test -test.v -test.count=1) >>"$T" 2>&1
	say "cuda tests rc=$?"
	(cd integration/python && ORBITKV_REQUIRE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider -rs tests/test_buffers_cuda.py tests/test_buffers.py) >>"$T" 2>&1
	say "python buffer tests rc=$? ($(tail -1 "$T"))"

	timeout 260 out/orbitkv bench gpu --reps 8 >"$O/bench_gpu.txt" 2>&1
	say "bench gpu rc=$?"
	grep -E "^(gpu|best|SUMMARY|CRC|through)" "$O/bench_gpu.txt" | tee -a "$S"

	start_peer /tmp/okv-ttft "$O/logs.txt" --dram-bytes 8GiB --ssd-bytes 0 || say "peer failed to start"
	(cd integration/python && timeout 300 python3 -m orbitkv.refengine.ttft --orbitkv-socket /tmp/okv-ttft/orbitkv.sock \
		--preset qwen3-8b --device cuda --prompt-tokens 8192 --prompts 4) >"$O/ttft.json" 2>>"$O/logs.txt"
	say "ttft probe rc=$?"
	python3 -c "
import json; d=json.load(open('$O/ttft.json'))
print('recompute', [round(x['ttft_s'],4) for x in d['recompute']], 'restore', [round(x['ttft_s'],4) for x in d['restore']],
      'restored_tokens', [x['restored_tokens'] for x in d['restore']], 'local_hit', [x['local_hit_tokens'] for x in d['restore']])
print('median recompute', d['recompute_ttft_median_s'], 'restore', d['restore_ttft_median_s'], 'ratio', d['restore_over_recompute'],
      'local-hit floor', round(d['local_prefix_hit']['ttft_s'],4), 'first tokens match', d['first_tokens_match'])" 2>&1 | tee -a "$S"
	curl -s 127.0.0.1:9464/metrics | grep -E "^orbitkv_(fabric_(saved|loaded)|transfer_inflight)" >>"$S"
	stop_all
}

sustained_one() { # CONFIG
	local cfg=$1 conn=() dir=${RUNDIR:-$O/runs}/${RUNNAME:-$1}
	case $cfg in
	dram) start_peer /tmp/okv-$cfg "$O/logs.txt" --dram-bytes 16GiB --ssd-bytes 0 || return 1 ;;
	ssd) start_peer /tmp/okv-$cfg "$O/logs.txt" --dram-bytes 4GiB --ssd-bytes 16GiB --ssd-file-bytes 1GiB || return 1 ;;
	esac
	[ "$cfg" != native ] && conn=(--connector orbitkv --orbitkv-socket /tmp/okv-$cfg/orbitkv.sock ${CONN_EXTRA:+--connector-extra "$CONN_EXTRA"})
	(cd integration/python && exec python3 -m orbitkv.refengine --preset qwen3-8b --device cuda --kv-tokens 16384 \
		--block-size 16 --page-tokens 64 --port 8000 ${ENGINE_ARGS:-} "${conn[@]}") >>"$O/logs.txt" 2>&1 &
	ENGINE_PID=$!
	for _ in $(seq 900); do
		curl -s -o /dev/null 127.0.0.1:8000/metrics && break
		kill -0 $ENGINE_PID 2>/dev/null || { say "$cfg: engine died"; stop_all; return 1; }
		sleep 0.2
	done
	local pm=()
	[ "$cfg" != native ] && pm=(--peer-metrics http://127.0.0.1:9464/metrics ${PEER_FLAGS:+--label "peer_flags=$PEER_FLAGS"})
	# only the exact backend is batch invariant: label the others' runs non-deterministic (bench report says so)
	case " ${ENGINE_ARGS:-} " in *" exact "*) ;; *) pm+=(--deterministic=false) ;; esac
	engine_metrics "$cfg before"
	timeout ${RUN_TIMEOUT:-200} out/orbitkv bench serving --endpoint http://127.0.0.1:8000 --vocab 151936 \
		--prefix-tokens 1024,4096,8192 --prefixes 12 --reuse 0.75 --concurrency 8 --duration ${DURATION:-60s} \
		--output-tokens 16 --quiet "${pm[@]}" --label config=$cfg --label pair=${PAIR:-1} ${ORDER:+--label order=$ORDER} \
		--output "$dir" >>"$O/logs.txt" 2>&1
	say "sustained $cfg rc=$?"
	engine_metrics "$cfg after"
	[ -f "$dir/summary.json" ] && head -c 1500 "$dir/summary.json" | tee -a "$S" && echo | tee -a "$S"
	stop_all
}

engine_metrics() { # LABEL: where the reference engine's time went (prefill vs decode steps, computed prompt tokens)
	curl -s --max-time 5 127.0.0.1:8000/metrics | grep -E "^orbitkv_refengine_(computed_prompt|prefill_step|decode_step|idle_step|steps_total|prompt_tokens_total|prefix_cache_hit|external_restored|preemptions|requests_finished)" |
		sed "s/^/[$1] /" | tee -a "$S"
}

REF_RUNS=/root/okv/ref-runs # outside the repository's folder: kept for the next call while the machine is warm
sustained() {
	mkdir -p "$REF_RUNS"
	for c in ${CONFIGS:-native dram ssd}; do
		rm -rf "$REF_RUNS/$c-${PAIR:-1}"
		RUNDIR=$REF_RUNS RUNNAME=$c-${PAIR:-1} sustained_one "$c"
	done
	out/orbitkv bench report "$REF_RUNS"/*-[0-9]* >"$O/report.txt" 2>&1 || true
	tail -40 "$O/report.txt" | tee -a "$S"
	(cd "$REF_RUNS/.." && tar czf "$O/runs.tgz" ref-runs)
}

peer() { # the through-the-peer rows again, copier pool vs one copier, TTFT with 8K-token steps
	timeout 200 out/orbitkv bench gpu --skip-methods --reps 8 >"$O/bench_gpu_peer.txt" 2>&1
	say "bench gpu (peer rows) rc=$?"
	grep -E "^(gpu|SUMMARY|CRC|through)" "$O/bench_gpu_peer.txt" | tee -a "$S"
	timeout 100 out/orbitkv bench gpu --skip-methods --reps 8 --pages 128 --block-tokens 16,64 --cuda-copiers 1 >"$O/bench_gpu_peer_c1.txt" 2>&1
	say "bench gpu (peer rows, --cuda-copiers 1) rc=$?"
	grep -E "^(SUMMARY|  *OrbitKV)" "$O/bench_gpu_peer_c1.txt" | tee -a "$S"
	start_peer /tmp/okv-ttft "$O/logs.txt" --dram-bytes 8GiB --ssd-bytes 0 || say "peer failed to start"
	(cd integration/python && timeout 200 python3 -m orbitkv.refengine.ttft --orbitkv-socket /tmp/okv-ttft/orbitkv.sock \
		--preset qwen3-8b --device cuda --prompt-tokens 8192 --prompts 4 --max-batched-tokens 8192 --profile) >"$O/ttft_mbt8192.json" 2>>"$O/logs.txt"
	say "ttft probe (8192-token steps) rc=$?"
	python3 -c "
import json; d=json.load(open('$O/ttft_mbt8192.json'))
print('recompute', [round(x['ttft_s'],4) for x in d['recompute']], 'restore', [round(x['ttft_s'],4) for x in d['restore']])
print('median recompute', d['recompute_ttft_median_s'], 'restore', d['restore_ttft_median_s'], 'ratio', d['restore_over_recompute'],
      'local-hit floor', round(d['local_prefix_hit']['ttft_s'],4))
print(d.get('local_hit_profile', {}).get('by_cuda', ''))" 2>&1 | tee -a "$S"
	stop_all
}

peer128() { # the 8K-token peer rows (the §6 restore/save target), then correctness on the GPU
	nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader | tee -a "$S"
	timeout ${BENCH_TIMEOUT:-130} out/orbitkv bench gpu --skip-methods --reps 8 --pages 128 --block-tokens 64,16 >"$O/bench_gpu_peer.txt" 2>&1
	say "bench gpu (peer rows, 128 pages) rc=$?"
	grep -E "^(gpu|SUMMARY|CRC|through)" "$O/bench_gpu_peer.txt" | tee -a "$S"
	T=$O/tests.txt
	(cd fabric && ORBITKV_REQUIRE=cuda timeout 60 ../out/fabric.test -test.run 'GPU|CUDA' -test.v -test.count=1) >"$T" 2>&1
	say "fabric GPU tests rc=$?"
	grep -E "^\s*(--- |FAIL|PASS|ok)" "$T" | head -20 | tee -a "$S"
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 40 ../out/cuda.test -test.count=1) >>"$T" 2>&1
	say "cuda tests rc=$? ($(tail -1 "$T"))"
}

pitched() { # copy methods incl. pitched 2D copies: cuda tests, method table + peer rows per method, fabric GPU tests
	nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader | tee -a "$S"
	T=$O/tests.txt
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 60 ../out/cuda.test -test.v -test.count=1) >"$T" 2>&1
	say "cuda tests rc=$? ($(tail -1 "$T"))"
	grep -E "^\s*--- (FAIL|SKIP)" "$T" | head -20 | tee -a "$S"
	timeout 200 out/orbitkv bench gpu --reps 8 --pages 128 --block-tokens 64,16 >"$O/bench_gpu.txt" 2>&1
	say "bench gpu (methods + peer rows, auto) rc=$?"
	grep -E "^(gpu|best|SUMMARY|PHASES)|pitched|kernel, 64|auto|contiguous|transport" "$O/bench_gpu.txt" | tee -a "$S"
	for m in ${PEER_METHODS:-kernel}; do
		timeout 120 out/orbitkv bench gpu --skip-methods --reps 8 --pages 128 --block-tokens 64,16 --cuda-method "$m" >"$O/bench_gpu_$m.txt" 2>&1
		say "bench gpu (peer rows, --cuda-method $m) rc=$?"
		grep -E "^(SUMMARY|PHASES)|transport" "$O/bench_gpu_$m.txt" | tee -a "$S"
	done
	for m in ${TEST_METHODS:-auto kernel}; do
		(cd fabric && ORBITKV_REQUIRE=cuda ORBITKV_CUDA_METHOD=$m timeout 90 ../out/fabric.test -test.run 'GPU|CUDA' -test.v -test.count=1) >>"$T" 2>&1
		say "fabric GPU tests (peer method $m) rc=$?"
		grep -E "^\s*(--- |FAIL|PASS|ok)" "$T" | tail -12 | tee -a "$S"
	done
	(cd fabric && timeout 60 ../out/fabric.test -test.run XXX -test.bench 'GPUPath' -test.benchtime 40x) >"$O/cpu_bench.txt" 2>&1
	say "fabric GPUPath benchmarks (peer CPU side on this host) rc=$?"
	grep -E "^Benchmark" "$O/cpu_bench.txt" | tee -a "$S"
}

ttft_probe() { # LABEL PYDIR TIMEOUT EXTRA...
	local label=$1 dir=$2 to=$3
	shift 3
	# shellcheck disable=SC2086 # PEER_EXTRA: extra peer flags, split on spaces
	start_peer /tmp/okv-ttft "$O/logs.txt" --dram-bytes 8GiB --ssd-bytes 0 ${PEER_EXTRA:-} || { say "$label: peer failed to start"; return 1; }
	(cd "$dir" && timeout "$to" python3 -m orbitkv.refengine.ttft --orbitkv-socket /tmp/okv-ttft/orbitkv.sock \
		--preset qwen3-8b --device cuda --prompt-tokens 8192 --prompts 4 "$@") >"$O/ttft_$label.json" 2>>"$O/logs.txt"
	say "ttft $label rc=$?"
	[ -n "${METRICS:-}" ] && curl -s 127.0.0.1:9464/metrics | grep -E "^orbitkv_transfer_(enqueue|layerwise)" >"$O/metrics_$label.txt"
	stop_all
	python3 -c "
import json; d=json.load(open('$O/ttft_$label.json'))
print('$label recompute', [round(x['ttft_s'],4) for x in d['recompute']], 'restore', [round(x['ttft_s'],4) for x in d['restore']],
      'restored', [x['restored_tokens'] for x in d['restore']])
print('$label median recompute', d['recompute_ttft_median_s'], 'restore', d['restore_ttft_median_s'], 'ratio', d['restore_over_recompute'],
      'local-hit floor', round(d['local_prefix_hit']['ttft_s'],4), '=', d['local_hit_over_recompute'], 'first tokens match', d['first_tokens_match'])" 2>&1 | tee -a "$S"
}

lwmethods() { # layer-wise TTFT per peer copy method, instrumented
	nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader | tee -a "$S"
	for m in ${METHODS:-kernel batch}; do
		PEER_EXTRA="--cuda-method $m" METRICS=1 ttft_probe "lw_$m" integration/python ${TTFT_TIMEOUT:-100} --layerwise --trace
		python3 - "$O/ttft_lw_$m.json" "$O/metrics_lw_$m.txt" <<'PY' 2>&1 | tee -a "$S"
import json, sys
d = json.load(open(sys.argv[1]))
for kind in ("restore", "local_prefix_hit"):
    rows = d[kind] if kind == "restore" else [d[kind]]
    for r in rows:
        b = r.get("breakdown", {})
        g = b.get("gpu_layer_ready_ms") or []
        print(kind, "ttft_ms", round(r["ttft_s"] * 1e3, 1), "steps", r["steps"],
              {k: round(v * 1e3, 2) for k, v in b.items() if k.endswith("_s")},
              "gpu layer0/1/last ready ms", g[:2], g[-1:], "lw", b.get("layerwise"))
sums = {}
for line in open(sys.argv[2]):
    name, v = line.rsplit(" ", 1)
    if name.endswith(("_sum", "_count")) or "_sum{" in name or "_count{" in name:
        sums[name] = float(v)
print("peer:", {k: round(v, 5) for k, v in sums.items()})
PY
	done
}

refengine() { # the reference engine's GPU path: tests, TTFT (restore vs recompute vs local hit), decode
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
	(cd integration/python && ORBITKV_REQUIRE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider -rs \
		tests/test_refengine_cuda.py) >"$O/tests.txt" 2>&1
	say "refengine cuda tests rc=$? ($(tail -1 "$O/tests.txt"))"
	ttft_probe after integration/python ${TTFT_TIMEOUT:-100}
	[ -n "${BASE:-}" ] && ttft_probe before "$BASE" ${TTFT_TIMEOUT:-100}
	for b in ${DECODE_BATCHES:-8}; do
		for label in after before; do
			local dir=integration/python
			[ $label = before ] && { [ -n "${BASE:-}" ] || continue; dir=$BASE; }
			(cd "$dir" && timeout 60 python3 -m orbitkv.refengine.bench --preset qwen3-8b --device cuda \
				--prompt-tokens 8192 --repeat 2 --batch "$b" --decode-tokens 32) >/tmp/okv-bench.json 2>>"$O/logs.txt"
			say "bench $label batch $b rc=$?: $(cat /tmp/okv-bench.json)"
			cat /tmp/okv-bench.json >>"$O/bench.jsonl"
		done
	done
}

steps() { # decode steps as CUDA graph replays (refengine graphs.py): correctness first, then the step times
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
	(cd integration/python && ORBITKV_REQUIRE=cuda timeout ${TEST_TIMEOUT:-100} python3 -m pytest -q -p no:cacheprovider -rs \
		tests/test_refengine_cuda.py tests/test_refengine_graphs.py) >"$O/tests.txt" 2>&1
	say "refengine CUDA + decode graph tests rc=$? ($(tail -1 "$O/tests.txt"))"
	grep -E "^(FAILED|ERROR)|refengine: " "$O/tests.txt" | head -20 | tee -a "$S"
	(cd integration/python && timeout ${STEPS_TIMEOUT:-110} python3 -m orbitkv.refengine.steps --preset qwen3-8b --device cuda \
		--backends sdpa --batches ${STEP_BATCHES:-1,8}) >"$O/steps.txt" 2>>"$O/logs.txt"
	say "step probe, sdpa rc=$?"
	grep -v '^{' "$O/steps.txt" | tee -a "$S"
	(cd integration/python && timeout ${EXACT_TIMEOUT:-80} python3 -m orbitkv.refengine.steps --preset qwen3-8b --device cuda \
		--backends exact --batches 8 --decode-steps 16 --rounds 1) >"$O/steps_exact.txt" 2>>"$O/logs.txt"
	say "step probe, exact rc=$?"
	grep -v '^{' "$O/steps_exact.txt" | tee -a "$S"
	grep -h "refengine: " "$O/logs.txt" | sort | uniq -c | head -12 | tee -a "$S"
}

layerwise() {
	nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader | tee -a "$S"
	T=$O/tests.txt
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 40 ../out/cuda.test -test.run 'StartGroups|RestoreSave' -test.v -test.count=1) >"$T" 2>&1
	say "cuda grouped-start tests rc=$?"
	grep -E "^\s*(--- |FAIL|PASS|ok)" "$T" | tee -a "$S"
	(cd fabric && ORBITKV_REQUIRE=cuda timeout 60 ../out/fabric.test -test.run 'GPULayerwise|GPUSession' -test.v -test.count=1) >>"$T" 2>&1
	say "fabric GPU tests rc=$?"
	grep -E "^\s*(--- |FAIL|PASS|ok)|gpu_test.go" "$T" | tail -12 | tee -a "$S"
	ttft_probe layerwise integration/python ${TTFT_TIMEOUT:-110} --layerwise
	ttft_probe oldpath integration/python ${TTFT_TIMEOUT:-110}
	mkdir -p "$O/runs"
	for c in ${CONFIGS:-native dram}; do
		DURATION=${DURATION:-30s} RUN_TIMEOUT=${RUN_TIMEOUT:-100} CONN_EXTRA='{"layerwise": true}' sustained_one "$c"
	done
	out/orbitkv bench report "$O/runs"/* >"$O/report.txt" 2>&1 || true
	tail -30 "$O/report.txt" | tee -a "$S"
	(cd "$O" && tar czf runs.tgz runs && rm -rf runs)
}

lwgates() { # gated layer-wise loads: GPU tests, then TTFT gated (copy engines) vs ungated kernel, one run
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$S"
	T=$O/tests.txt
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 30 ../out/cuda.test -test.run 'Gates|StartGroups' -test.v -test.count=1) >"$T" 2>&1
	say "cuda gate tests rc=$?"
	grep -E "^\s*(--- |FAIL|PASS|ok)|gates_test.go" "$T" | tee -a "$S"
	(cd fabric && ORBITKV_REQUIRE=cuda timeout 30 ../out/fabric.test -test.run 'GPULayerwise' -test.v -test.count=1) >>"$T" 2>&1
	say "fabric GPU layer-wise tests rc=$?"
	grep -E "^\s*(--- |FAIL|ok)" "$T" | tail -6 | tee -a "$S"
	METHODS="${LW_RUNS:-gated kernel}"
	for m in $METHODS; do
		case $m in
		gated) PEER_EXTRA="--cuda-layer-gates=true" ;;
		kernel) PEER_EXTRA="--cuda-method kernel --cuda-layer-gates=false" ;;
		esac
		PEER_EXTRA=$PEER_EXTRA METRICS=1 ttft_probe "lw_$m" integration/python ${TTFT_TIMEOUT:-75} --layerwise --trace
		grep -E "enqueue_seconds_(sum|count)|layerwise_device_seconds_(sum|count)" "$O/metrics_lw_$m.txt" | tee -a "$S"
	done
}

final() { # every GPU test (cuda, transfer, fabric on auto), the 8K-token peer rows, one gated TTFT probe
	nvidia-smi --query-gpu=name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader | tee -a "$S"
	T=$O/tests.txt
	(cd cuda && ORBITKV_REQUIRE=cuda timeout 60 ../out/cuda.test -test.count=1) >"$T" 2>&1
	say "cuda tests rc=$? ($(tail -1 "$T"))"
	(cd transfer && ORBITKV_REQUIRE=cuda timeout 60 ../out/transfer.test -test.v -test.count=1) >>"$T" 2>&1
	say "transfer tests rc=$? ($(tail -1 "$T"))"
	grep -E "^--- (FAIL|SKIP)|Stuck" "$T" | tee -a "$S"
	(cd fabric && ORBITKV_REQUIRE=cuda timeout 90 ../out/fabric.test -test.run 'GPU|CUDA|Stuck' -test.v -test.count=1) >>"$T" 2>&1
	say "fabric GPU tests rc=$?"
	grep -E "^--- " "$T" | tail -12 | tee -a "$S"
	timeout 100 out/orbitkv bench gpu --skip-methods --reps 8 --pages 128 --block-tokens 64 >"$O/bench_gpu_peer.txt" 2>&1
	say "bench gpu (peer rows, 128 pages, auto) rc=$?"
	grep -E "^(SUMMARY|PHASES)|transport" "$O/bench_gpu_peer.txt" | tee -a "$S"
	PEER_EXTRA="--cuda-layer-gates=true" METRICS=1 ttft_probe "lw_gated" integration/python ${TTFT_TIMEOUT:-75} --layerwise --trace
}

invariant() { # issue 11: the batch-invariant GPU mode (exact attention, 64-token tiles): its CUDA test, then
	# 30-s sustained runs native / DRAM / SSD whose reused prompts must all match their serial
	# reference, then the control: a DRAM run whose peer flips a bit of every 20th restore
	# (ORBITKV_TEST_CORRUPT_LOADS, test-only) must mismatch. Slow by design (a correctness mode).
	(cd integration/python && ORBITKV_REQUIRE=cuda timeout 300 python3 -m pytest -q -p no:cacheprovider \
		tests/test_refengine_cuda.py -k invariant) >>"$O/logs.txt" 2>&1
	say "refengine CUDA invariance test rc=$?"
	mkdir -p "$O/runs"
	local c
	for c in ${CONFIGS:-native dram ssd}; do
		ENGINE_ARGS="--attn-backend exact" DURATION=${DURATION:-30s} PAIR=invariant sustained_one "$c"
	done
	mv "$O/runs/dram" "$O/runs/dram-invariant" 2>/dev/null
	ENGINE_ARGS="--attn-backend exact" DURATION=${DURATION:-30s} PAIR=corrupt PEER_ENV=ORBITKV_TEST_CORRUPT_LOADS=20 sustained_one dram
	mv "$O/runs/dram" "$O/runs/dram-corrupt" 2>/dev/null
	grep -H '"mismatches"' "$O"/runs/*/summary.json | tee -a "$S"
	(cd "$O" && tar czf runs.tgz runs && rm -rf runs)
}

unxz_bins orbitkv # carried compressed
case ${1:-check} in
check) check ;;
invariant) invariant ;;
peer) peer ;;
peer128) peer128 ;;
pitched) pitched ;;
refengine) refengine ;;
steps) steps ;;
sustained) sustained ;;
layerwise) layerwise ;;
lwmethods) lwmethods ;;
lwgates) lwgates ;;
final) final ;;
*) echo "usage: $0 check|sustained|invariant|peer|peer128|pitched|refengine|steps|layerwise|lwmethods|lwgates|final" >&2; exit 2 ;;
esac
