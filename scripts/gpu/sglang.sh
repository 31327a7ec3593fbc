#!/bin/bash
# Real SGLang 0.5.17 driving OrbitKV through its HiCache storage backend on the H200 (issue 12;
# docs/journal/2026-12-02-sglang-h200.md "Real SGLang on the H200"). Every flag is checked against SGLang 0.5.17's own
# argument parser on a CPU (sglang-check.py); every mode below ran on the H200 on 2026-12-02 (docs:
# "First runs on the H200", "Pairs, SSD, 8K recovery and the `l2` config").
#
# What travels: .gpucarry/sglang-site.partNN (scripts/gpu/sglang-bundle.sh; sglang-site.sha256 and
# sglang-site.parts with every part), unpacked to /root/okv/sgl; the vLLM site /root/okv/site
# (scripts/gpu/vllm.sh carry1, carry2: fastapi, uvicorn, pydantic, pyzmq, ... which SGLang needs
# too) searched after it; out/orbitkv.xz (CGO_ENABLED=1 go build -ldflags=-checklinkname=0
# -o out/orbitkv ./cmd/orbitkv; xz -k out/orbitkv) with the LAST part (the smallest), kept at
# /root/okv/orbitkv for the calls after it. Each call's tree is at most 64 MiB: one part a call.
#
#   scripts/gpu/sglang.sh carryNN [MODE...]   moves part NN out of the repository (to /root/okv);
#                                             once all parts are there: joins, checks the sha256,
#                                             unpacks to /root/okv/sgl, then runs the MODEs
#   scripts/gpu/sglang.sh MODE...             later calls while the machine is warm
# SGL_VERSION=0.5.23 (first ran on the H100 of 2026-12-06 09:48, 5 parts): the same with SGLang 0.5.23, the version users install
# (.gpucarry/sglang0523-site.partNN, unpacked to /root/okv/sgl0523) over the vLLM 0.33 site
# /root/okv/site033 (torch 2.14.0 for SGLang's pin 2.14.1: sgl_kernel 0.4.10 imports no torch symbol
# 2.14.0 lacks), carried first by VLLM=0.33 scripts/gpu/vllm.sh carry00 ... carryNN; run `imports` first.
# MODEs (configs: native = SGLang's radix cache in HBM, HiCache off; ceiling = native with an HBM pool of
# 131,072 tokens, the whole working set (bench report's fraction recovered); l2 = HiCache with a host pool
# of HOST_GB+16 GB and no storage, SGLang's own DRAM tier as large as the dram config's two together;
# dram = HiCache, host pool HOST_GB (default 4), OrbitKV peer 16 GiB DRAM (dram-hN: host pool N GB,
# e.g. dram-h16 beside dram in one SEQ, each run labelled by its own name); ssd = the same, peer
# 4 GiB DRAM + 16 GiB SSD; the HBM pool is 16,384 tokens, 64-token pages, in every config):
#   imports       the server's imports and the backend's, no GPU work (30 s)
#   sustained     the seeds' workload (12 prefixes of 1K/4K/8K, 75% reuse, concurrency 8, 60 s + drain,
#                 16 output tokens) once per config in SEQ (default "native dram ssd"), a fresh server
#                 and peer per run; PAIR/ORDER label the runs for bench report (AB/BA pairs)
#   recovery      8K-token TTFT per config in RECOVERY_SEQ (default "dram"; "native l2 dram-h16" puts SGLang's
#                 own pool beside OrbitKV): cold (recompute), resident (SGLang's radix cache), evicted (after
#                 32K filler tokens), restart = after POST /flush_cache (HBM and host pool emptied, so the
#                 prefix comes back from OrbitKV alone, and l2 recomputes); runs in $RUNS/probes, own report
#                 PYSPY=1: 10 py-spy stack dumps of the server and its children, 1.5 s apart, from the run's
#                 start (carry .gpucarry/pyspy/py_spy-*.whl once) into $RUNS/probes/CFG-N.dumps.txt (runs.tgz)
#   deterministic --enable-deterministic-inference, configs in DETSEQ (default "dram"), 30 s windows:
#                 every reused prompt must match its serial reference token for token
#   report        bench report over every sustained run so far
#
# Plan (SGLang's start: 171-189 s the first time on a fresh H200, 107 s on the H100 of 2026-12-05; 52-92 s
# after; a sustained run = start + 12 serial prefixes + 60 s + drain ~= 120-260 s). The bundle is 4 parts
# today (166 MiB in 48 MiB parts: with the 5 MiB tree a 60 MiB part overflowed a call's 64 MiB;
# sglang-bundle.sh prints the count). Calls, each naming its files in carry:
#   1 vllm.sh carry1     .gpucarry/vllm-site.part00 .gpucarry/vllm-site.sha256         } only when
#   2 vllm.sh carry2     .gpucarry/vllm-site.part01 .gpucarry/vllm-site.sha256         } no /root/okv/site
#   3 sglang.sh carry00  .gpucarry/sglang-site.part00 .gpucarry/sglang-site.sha256 .gpucarry/sglang-site.parts
#   4,5 sglang.sh carry01, carry02  the same with part01, part02                         5-6 s each
#   6 SEQ="native l2" sglang.sh carry03 sustained   part03 + out/orbitkv.xz            ~320 s (H100)
#   7 SEQ="dram-h16 dram" sglang.sh sustained report                                   ~260 s (H100)
# The H100 session of 2026-12-05 22:00 ran 1-7, a BA pair of dram-h16/l2 and one more dram run
# after a vLLM restart pair in 28 min of device time. recovery and deterministic: ~400 s more.
# Every step has its own timeout; logs land in $OUT (at most 8 files come back: summary.txt,
# sglang-tail.log, peer.log, bench.log, imports.txt, report.txt, runs.tgz).
set -u
. "$(dirname "$0")/lib.sh"
gpu_env
O=${OUT:-/tmp/orbitkv-gpu-out}
K=${OKV_DIR:-/root/okv} # OKV_DIR: only for a dry run of the carry steps off the GPU machine
# SGL_VERSION=0.5.23: SGLang 0.5.23 (.gpucarry/sglang0523-site.partNN: SGL=0.5.23 sglang-bundle.sh) over the
# vLLM 0.33 site /root/okv/site033 (torch 2.14.0; VLLM=0.33 scripts/gpu/vllm.sh carry00 ... first) instead of
# 0.5.17 over the vLLM 0.26 site; its runs go to their own folder, so bench report never mixes versions
case ${SGL_VERSION:=0.5.17} in
0.5.17) BUNDLE=sglang-site SGL=$K/sgl BASE=$K/site RUNS=$K/sgl-runs BASE_HOW="scripts/gpu/vllm.sh carry1 and carry2" ;;
0.5.23) BUNDLE=sglang0523-site SGL=$K/sgl0523 BASE=$K/site033 RUNS=$K/sgl0523-runs BASE_HOW="VLLM=0.33 scripts/gpu/vllm.sh carry00 ..." ;;
*) echo "SGL_VERSION=$SGL_VERSION: 0.5.17 or 0.5.23" >&2; exit 2 ;;
esac
export -n SGL_VERSION # SGLang reads SGL_* as its own SGLANG_* settings (a deprecation warning at every start)
ROOT=$(pwd)
S=$O/summary.txt
MODEL=$ROOT/integration/models/qwen3-8b
PORT=8000
HOST_GB=${HOST_GB:-4}
ENGINE_PID="" PEER_PID=""
BIN=out/orbitkv

stop_all() { # the server's process group (its scheduler and detokenizer are children), then the peer
	stop_groups $ENGINE_PID
	[ -n "$PEER_PID" ] && stop_groups "$PEER_PID"
	ENGINE_PID="" PEER_PID=""
	wait_gpu_free
}
trap stop_all EXIT

carry() { # NN: move one carried part out of the repository folder (laid anew at every call)
	carry_part $BUNDLE "$1" "$K" && cp .gpucarry/$BUNDLE.parts "$K/" || return 1
	say "$(nparts) of $(cat "$K/$BUNDLE.parts") sglang $SGL_VERSION part(s) under $K"
}

nparts() { ls "$K" | grep -c "^$BUNDLE\.part[0-9][0-9]\$"; } # not $BUNDLE.parts, the count file

complete() { [ -d "$SGL/sglang" ] || [ "$(nparts)" = "$(cat "$K/$BUNDLE.parts" 2>/dev/null)" ]; }

unpack() {
	[ -d "$SGL/sglang" ] && { say "sglang site already unpacked"; return 0; }
	[ -d "$BASE/vllm" ] || { say "no vLLM site at $BASE: run $BASE_HOW first"; return 1; }
	unpack_bundle $BUNDLE "$K" "$SGL"
}

# The environment every SGLang process gets (an array, not a function: timeout runs programs)
# (the CuTe DSL's packages: its .pth is not read from PYTHONPATH; sglang0523-carry.txt)
SGLENV=(env PYTHONPATH="$SGL:$SGL/nvidia_cutlass_dsl/dsl_packages:$BASE:$ROOT/integration/python" HF_HUB_OFFLINE=1
	SGLANG_ENABLE_JIT_DEEPGEMM=0)

imports() { # the server's modules and our backend, importable with the image's torch (no GPU work)
	timeout 120 "${SGLENV[@]}" python3 - >"$O/imports.txt" 2>&1 <<'PY'
import importlib, importlib.util, sys, torch
import sglang, sgl_kernel, transformers
try:  # 0.5.17's bundle carries it; 0.5.23 imports it only inside try/except (sglang0523-carry.txt)
    import flashinfer
    fi = flashinfer.__version__
except ImportError:
    fi = "absent"
print("sglang", sglang.__version__, "sgl_kernel", sgl_kernel.__version__, "torch", torch.__version__,
      "transformers", transformers.__version__, "flashinfer", fi)
print("sgl_kernel common_ops:", sgl_kernel.common_ops.__file__)
radix = "hiradix_cache" if importlib.util.find_spec("sglang.srt.mem_cache.hiradix_cache") else "unified_radix_cache"  # 0.5.23
for m in ["sglang.srt.server_args", "sglang.srt.entrypoints.http_server", "sglang.srt.managers.scheduler",
          "sglang.srt.model_executor.model_runner", "sglang.srt.models.qwen3",
          "sglang.srt.layers.attention.flashattention_backend", "sglang.srt.mem_cache." + radix,
          "sglang.srt.mem_cache.storage.backend_factory", "sgl_kernel.flash_attn", "orbitkv.sglang"]:
    importlib.import_module(m)
    print("ok", m)
# imported inside functions on the server's path (the loop above does not reach them)
if importlib.util.find_spec("sglang.srt.layers.dual_gemm"):  # 0.5.23: Qwen3's MLP, on every CUDA platform
    importlib.import_module("sglang.kernels.ops.gemm.cutedsl_dual_gemm")
    print("ok sglang.kernels.ops.gemm.cutedsl_dual_gemm")
from sglang.srt.mem_cache.hicache_storage import HiCacheStorage
from orbitkv.sglang import OrbitKVHiCacheStorage
assert issubclass(OrbitKVHiCacheStorage, HiCacheStorage)
print("imports ok")
PY
	say "imports rc=$? ($(tail -1 "$O/imports.txt"))"
	head -2 "$O/imports.txt" | tee -a "$S"
}

base() { echo "${1%-h[0-9]*}"; } # CONFIG: dram-h16 -> dram
host_gb() { case $1 in *-h[0-9]*) echo "${1##*-h}" ;; *) echo "$HOST_GB" ;; esac; } # CONFIG: its host pool (GB)

start_peer() { # CONFIG: dram | ssd (or either with -hN)
	set -- "$(base "$1")"
	local dir=/tmp/okv-$1
	rm -rf "$dir"
	local tier=(--dram-bytes 16GiB --ssd-bytes 0)
	[ "$1" = ssd ] && tier=(--dram-bytes 4GiB --ssd-bytes 16GiB --ssd-file-bytes 1GiB)
	# --cuda off: SGLang's backend hands the peer host memory (its staging buffer), never HBM
	# PEER_FLAGS (e.g. --ssd-readmit-all) go to every peer and label the runs (peer_flags=...)
	"$BIN" serve --data-dir "$dir" --cuda off --metrics-addr 127.0.0.1:9464 --query-budget-bytes 2GiB "${tier[@]}" ${PEER_FLAGS:-} >>"$O/peer.log" 2>&1 &
	PEER_PID=$!
	wait_socket "$dir/orbitkv.sock" "$PEER_PID" 900 && return 0
	say "peer $1 not serving (ended, or not within 90 s)"
	tail -5 "$O/peer.log" | tee -a "$S"
	return 1
}

# Shared by every config. --max-total-tokens caps the HBM KV pool at 16,384 tokens (vLLM's
# --num-gpu-blocks-override 1024 x 16); --chunked-prefill-size and --max-running-requests are
# vLLM's --max-num-batched-tokens 8192 and --max-num-seqs 64; --sampling-backend pytorch keeps
# flashinfer's JIT out (temperature 0: greedy either way); --grammar-backend none: no xgrammar.
SGL_FLAGS=(--model-path "$MODEL" --load-format dummy --skip-tokenizer-init --dtype bfloat16 --context-length 16384
	--page-size 64 --max-total-tokens 16384 --chunked-prefill-size 8192 --max-running-requests 64
	--attention-backend ${ATTN:-fa3} --sampling-backend pytorch --grammar-backend none
	--served-model-name qwen3-8b --host 127.0.0.1 --port $PORT --enable-metrics --enable-cache-report)
# HiCache configs: host pool, layout and policies named, not left to defaults that move between
# releases. layer_first (with the "shm" allocator, extra_config) is the layout the peer maps zero
# copy; page_first is staged through a buffer (LAYOUT=page_first to compare). wait_complete: a prefetch from OrbitKV finishes before the request is scheduled, so
# the restore is in the TTFT, never silently cut to a recompute.
# WRITE_POLICY (write_through_selective: only nodes hit twice go down), PREFETCH (timeout, best_effort)
# and HOST_MODE (SGLang >= 0.5.23: buffer_only, the host pool as staging for L3; in "cache" mode
# prefetches stop once those in flight reserve half the host pool) are the knobs that bound L3.
HICACHE=(--enable-hierarchical-cache --hicache-mem-layout ${LAYOUT:-layer_first} --hicache-io-backend kernel
	--hicache-write-policy ${WRITE_POLICY:-write_through} --hicache-storage-prefetch-policy ${PREFETCH:-wait_complete}
	${HOST_MODE:+--hicache-host-memory-mode $HOST_MODE})

extra_config() { # CONFIG: the JSON SGLang's "dynamic" backend factory hands our backend
	# "allocator":"shm": SGLang allocates its host pool as a memfd, which the peer maps through
	# /proc/PID/fd/N (zero copy); ALLOCATOR=default stages every page through a buffer instead.
	echo "{\"backend_name\":\"orbitkv\",\"module_path\":\"orbitkv.sglang\",\"class_name\":\"OrbitKVHiCacheStorage\",\"interface_v1\":1,\"allocator\":\"${ALLOCATOR:-shm}\",\"socket\":\"/tmp/okv-$1/orbitkv.sock\"}"
}

config_flags() { # CONFIG: the flags of one config (printed one a line)
	local gb
	gb=$(host_gb "$1")
	case $(base "$1") in
	native) ;;
	ceiling) printf '%s\n' --max-total-tokens 131072 ;; # the later flag wins: HBM holds the working set
	l2) printf '%s\n' "${HICACHE[@]}" --hicache-size $((gb + 16)) ;;
	dram | ssd) printf '%s\n' "${HICACHE[@]}" --hicache-size "$gb" --hicache-storage-backend dynamic \
		--hicache-storage-backend-extra-config "$(extra_config "$(base "$1")")" ;;
	*) return 1 ;;
	esac
}

start_sglang() { # CONFIG [FLAG...]
	local cfg=$1
	shift
	local kv
	mapfile -t kv < <(config_flags "$cfg")
	echo "=== $(date +%T) sglang $cfg ${SGL_FLAGS[*]} ${kv[*]} $*" >>"$O/sglang.log"
	setsid "${SGLENV[@]}" PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False \
		python3 -m sglang.launch_server "${SGL_FLAGS[@]}" "${kv[@]}" "$@" >>"$O/sglang.log" 2>&1 &
	ENGINE_PID=$!
	local t0=$SECONDS
	while [ $((SECONDS - t0)) -lt ${START_TIMEOUT:-300} ]; do
		if curl -sf -o /dev/null 127.0.0.1:$PORT/health; then
			say "sglang $cfg up in $((SECONDS - t0)) s"
			# SGLang falls back (a warning, not an error) when its JIT HiCache kernels do not build
			grep -E "Failed to load JIT|storage backend|OrbitKV|orbitkv" "$O/sglang.log" | sort | uniq -c | sort -rn | head -6 | tee -a "$S"
			return 0
		fi
		kill -0 $ENGINE_PID 2>/dev/null || break
		sleep 0.5
	done
	say "sglang $cfg failed to start within $((SECONDS - t0)) s"
	grep -E "Error|error|Traceback" "$O/sglang.log" | tail -12 | tee -a "$S"
	return 1
}

DET=() # set once the binary is known (below): --deterministic=false where bench serving has the flag

bench() { # CFG NAME BENCH-ARGS...
	local cfg=$1 name=$2
	shift 2
	local pm=()
	case $(base "$cfg") in dram | ssd) pm=(--peer-metrics http://127.0.0.1:9464/metrics ${PEER_FLAGS:+--label "peer_flags=$PEER_FLAGS"}) ;; esac
	fresh_run_dir "$RUNS/$name"
	# --api sglang: SGLang's /generate with input_ids; without a tokenizer (--skip-tokenizer-init) its
	# OpenAI routes fail every request (HTTP 500, KeyError 'text': the H200, 2026-12-02)
	timeout ${RUN_TIMEOUT:-300} "$BIN" bench serving --endpoint http://127.0.0.1:$PORT --api sglang --vocab 151936 \
		--engine-metrics http://127.0.0.1:$PORT/metrics "${pm[@]}" --quiet --label config=$cfg --label engine=sglang-${SGL_VERSION:-0.5.17} \
		--label "engine_flags=${SGL_FLAGS[*]} $(config_flags "$cfg" | tr '\n' ' ')" "$@" --output "$RUNS/$name" >>"$O/bench.log" 2>&1
	say "bench $name rc=$?"
	[ -f "$RUNS/$name/summary.json" ] && head -c 1200 "$RUNS/$name/summary.json" | tee -a "$S" && echo | tee -a "$S"
	curl -s --max-time 5 127.0.0.1:$PORT/metrics | grep -E "^sglang:(prompt_tokens_total|cached_tokens_total|cache_hit_rate|num_retracted_reqs|.*hicache.*|.*storage.*|.*prefetch.*|.*backup.*)" |
		grep -v "_bucket{" | tag_lines "$name sglang" | head -80 | tee -a "$S"
	[ ${#pm[@]} -gt 0 ] && curl -s --max-time 5 127.0.0.1:9464/metrics |
		grep -E "^orbitkv_fabric_(saved_pages|loaded_pages|lookup_hit_pages|lookup_miss_pages|lookup_budget_cut_pages)_total|^orbitkv_tiers_(demoted|promoted)_pages_total|^orbitkv_tiers_dram_unflushed_drops_total|^orbitkv_tiers_ssd_read_bytes_per_second" |
		tag_lines "$name peer" | tee -a "$S"
	return 0
}

one() { # CFG NAME [SGLANG-FLAG...] -- BENCH-ARGS...
	local cfg=$1 name=$2
	shift 2
	local flags=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do flags+=("$1"); shift; done
	shift
	case $(base "$cfg") in dram | ssd) start_peer "$cfg" || return 1 ;; esac
	start_sglang "$cfg" "${flags[@]}" || { stop_all; return 1; }
	# PYSPY=1: stack dumps of the server and its children through the run's first seconds (a first-request stall)
	[ "${PYSPY:-0}" = 1 ] && mkdir -p "$(dirname "$RUNS/$name")" && pyspy_dumps "$ENGINE_PID" "$RUNS/$name.dumps.txt" "${PYSPY_DUMPS:-10}" 1.5
	bench "$cfg" "$name" "$@"
	stop_all
}

SEEDS=(--workload sustained --prefix-tokens 1024,4096,8192 --prefixes 12 --reuse 0.75 --concurrency 8 --output-tokens 16)

sustained() {
	for cfg in ${SEQ:-native dram ssd}; do
		one "$cfg" "${cfg}-${PAIR:-1}" -- "${SEEDS[@]}" --duration ${DURATION:-60s} "${DET[@]}" --label pair=${PAIR:-1} --label order=${ORDER:-AB}
	done
}

recovery() { # per config in RECOVERY_SEQ, runs in $RUNS/probes with a report of their own
	local cfg
	for cfg in ${RECOVERY_SEQ:-dram}; do
		one "$cfg" "probes/$cfg-${PAIR:-1}" -- --workload probes --probe-tokens ${PROBE_TOKENS:-8192} --filler-tokens 32768 "${DET[@]}" \
			--restart-cmd "curl -sf -X POST http://127.0.0.1:$PORT/flush_cache" --label mode=recovery \
			--label pair=${PAIR:-1} --label order=${ORDER:-AB}
		phases_line "recovery-$cfg" "$RUNS/probes/$cfg-${PAIR:-1}"
	done
	timeout 60 "$BIN" bench report "$RUNS"/probes/*-[0-9] >"$O/probe-report.txt" 2>&1 # the sustained report refuses probe runs
	say "bench report (probes) rc=$?"
	tail -20 "$O/probe-report.txt" | tee -a "$S"
}

deterministic() {
	for cfg in ${DETSEQ:-dram}; do
		one "$cfg" "deterministic-$cfg" --enable-deterministic-inference -- "${SEEDS[@]}" --duration 30s \
			--label pair=deterministic --label mode=deterministic-inference
	done
}

report() {
	timeout 60 "$BIN" bench report "$RUNS"/*-[0-9] >"$O/report.txt" 2>&1
	say "bench report rc=$?"
	tail -40 "$O/report.txt" | tee -a "$S"
}

if [ "${1:-}" = flags ]; then # flags CONFIG [FLAG...]: the server's argv, one a line (sglang-check.py, on a CPU)
	trap - EXIT
	printf '%s\n' "${SGL_FLAGS[@]}" && config_flags "$2" && shift 2 && { [ $# -eq 0 ] || printf '%s\n' "$@"; }
	exit
fi
mkdir -p "$O" "$K" "$RUNS"
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee -a "$S"
if [ -f out/orbitkv.xz ]; then # carried compressed with the last part
	python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" out/orbitkv.xz "$K/orbitkv" && chmod +x "$K/orbitkv"
fi
[ -x "$BIN" ] || BIN=$K/orbitkv
"$BIN" bench serving --help 2>&1 | grep -q -- -deterministic && DET=(--deterministic=false)
case ${1:-} in
carry[0-9][0-9])
	carry "${1#carry}" || exit 1
	shift
	complete || { [ $# -eq 0 ] || say "parts missing: modes $* not run"; exit 0; }
	unpack || exit 1
	;;
esac
[ $# -gt 0 ] && { [ -d "$SGL/sglang" ] || { say "no SGLang site at $SGL: carry its parts first"; exit 1; }; }
[ $# -gt 0 ] && { [ -x "$BIN" ] || { say "no orbitkv binary: carry out/orbitkv.xz"; exit 1; }; }
for m in "$@"; do
	case $m in
	imports | sustained | recovery | deterministic | report) $m ;;
	*) echo "usage: $0 carryNN [MODE...] | MODE... (imports sustained recovery deterministic report)" >&2; exit 2 ;;
	esac
done
(cd "$K" && tar czf "$O/runs.tgz" "${RUNS##*/}")
[ -f "$O/sglang.log" ] && tail -c 4000000 "$O/sglang.log" >"$O/sglang-tail.log" && rm -f "$O/sglang.log"
exit 0
