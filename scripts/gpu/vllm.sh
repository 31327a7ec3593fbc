#!/bin/bash
# Real vLLM driving OrbitKV on the H200/H100 (docs/journal/2026-12-01-vllm-h200.md "Real vLLM on the H200").
# VLLM=0.26 (default): vLLM 0.26.0 on the image's torch 2.11; VLLM=0.33: vLLM 0.33.0, the version users
# install, with its own torch 2.14.0, triton 3.8.0 and CUDA 13 libraries (scripts/gpu/vllm033-bundle.sh).
# vLLM travels as .gpucarry/ (built on the development machine), one part a device call; out/orbitkv(.xz)
# is the peer built with cgo (CGO_ENABLED=1 go build -ldflags=-checklinkname=0 -o out/orbitkv ./cmd/orbitkv;
# xz -k out/orbitkv), carried with the last part and by every later call.
#   0.26 (scripts/gpu/vllm-bundle.sh, site /root/okv/site): call 1 carries .gpucarry/vllm-site.part00 and
#        .gpucarry/vllm-site.sha256; call 2 .gpucarry/vllm-site.part01, the .sha256 and out/orbitkv.xz
#     scripts/gpu/vllm.sh carry1              call 1: moves part 0 out of the repository (to /root/okv)
#     scripts/gpu/vllm.sh carry2 MODE...      call 2: moves part 1, joins, checks the sha256, unpacks
#                                             the site to /root/okv/site, then runs the MODEs
#   0.33 (site /root/okv/site033): call k (k = 0 .. N-1, N = .gpucarry/vllm033-site.parts, about 26)
#        carries .gpucarry/vllm033-site.partKK, vllm033-site.sha256 and vllm033-site.parts (5-6 s of device time a call, 2026-12-06);
#        the last one out/orbitkv.xz too (48 MiB + 8 MiB + the 5 MiB tree fit a call's 64 MiB)
#     VLLM=0.33 scripts/gpu/vllm.sh carryKK [MODE...]   moves part KK out of the repository (to /root/okv);
#                                             once all N are there: joins, checks the sha256, unpacks
#                                             to /root/okv/site033 (4.5 GB), runs one kernel each from
#                                             torch, cuBLASLt, vLLM's _C and FA3 (every non-sm_90 cubin
#                                             was zeroed), then the MODEs. lmcache is 0.26's only.
#   [VLLM=0.33] scripts/gpu/vllm.sh MODE...   later calls while the machine is warm (site already there)
# MODEs:
#   sustained   the seeds' sustained workload (12 prefixes of 1K/4K/8K, 75% reuse, concurrency 8,
#               60 s + drain, 16 output tokens, HBM 16,384 tokens, 64-token pages) once per config
#               in SEQ (default "native dram ssd"), fresh vLLM and peer per run; PAIR/ORDER label
#               the runs for bench report (AB/BA pairs: SEQ="native dram ssd" then "ssd dram native").
#               Configs: native (HBM capped), ceiling (HBM holds the working set: 8,192 blocks),
#               offload (vLLM's own CPU offloading, --kv-offloading-backend native, 16 GiB),
#               lmcache (LMCache's in-process connector, 16 GB CPU; .gpucarry/lmcache-site.tar.xz
#               carried: scripts/gpu/lmcache-bundle.sh), dram and ssd (OrbitKV), offload-okv (VLLM=0.33
#               only, first run on an H100 on 2026-12-06: vLLM's own offloading with TIER_SPLIT_GIB (8) in its CPU
#               pool and OrbitKV as its secondary tier, orbitkv.vllm_tier.OrbitKVTier, with the rest of
#               the 16 GiB in the peer; TIER_OPTS adds keys to the tier's entry, e.g. '"worker":"thread"').
#               `vllm.sh flags CONFIG` prints a config's engine flags:
#               scripts/gpu/vllm-check.py parses each with the installed vLLM (make test-vllm, test-vllm033)
#   probe       8K-token TTFT probes, per config in PROBE_SEQ (default "dram"; "native offload dram" puts
#               the alternatives beside it), PROBE_REPS (3) fresh prompts each: cold (recompute), resident
#               (vLLM's own prefix cache), evicted (after 32K filler tokens: restored by the config's cache,
#               recomputed by native); PROBE_RESTART=1 adds restart (vLLM killed -9 and started again: OrbitKV's
#               pages survive, vLLM's offloading cache does not). Without restarts ~2 min a config, with ~1.5 min
#               more a prompt: PROBE_RESTART=1 PROBE_REPS=2 is one config a call. OrbitKV configs trace the
#               connector's hooks per step (ORBITKV_HOOK_TRACE, orbitkv.hooktrace; HOOK_TRACE=0: off) into
#               runs*/probes/CFG-N.hooks/ and print per-hook totals and each restore's timeline.
#               PROBE_TOKENS (8192): a length that is not a multiple of the 64-token page (8200) ends in
#               a partial page, as most real prompts do (never saved; a whole last page is looked up, not saved again)
#               PYSPY=1: py-spy samples the server and its engine process through each run (carry
#               .gpucarry/pyspy/py_spy-*.whl once; lib.sh pyspy_start) into runs*/probes/CFG-N.pyspy, and the
#               summary gives each process's two busiest threads and their frames (scripts/gpu/pyspy-summary.py)
#   overhead    the connector's per-step cost: 48-token prompts (no page to save or load), 128
#               output tokens, vLLM with OrbitKV vs without; decode step = inter-token latency
#   invariant   VLLM_BATCH_INVARIANT=1: native, DRAM and SSD (or INV_SEQ) sustained runs (30 s windows) whose
#               reused prompts must match their serial reference token for token (~2-3 min each
#               with vLLM's start: run corrupt in a call of its own)
#   corrupt     the control for invariant: a DRAM run (batch-invariant) whose peer flips one bit of every
#               20th restore (ORBITKV_TEST_CORRUPT_LOADS, a test-only hook): its reused prompts must mismatch
#   two         two engines on the one GPU (each --gpu-memory-utilization 0.42, HBM capped as in
#               sustained) behind `orbitkv route-proxy --round-robin`, the seeds' workload; per config
#               in TWO_SEQ (default "offload dram"): offload = vLLM's own CPU offloading, 8 GiB in each
#               engine (16 in all); dram = one shared OrbitKV peer with 16 GiB
#   restart     an engine restarted mid-run, per config in RESTART_SEQ (default "offload dram"; one
#               config fits a 600-s call): the seeds' workload for DURATION (90s), vLLM killed (-9)
#               RESTART_AT (30s) into it once the requests in flight are done, started again with the
#               same flags; summary.json's restart: the rate before, when the engine answered again and
#               how long until the rate was back (OrbitKV's peer keeps its pages; vLLM's offloading
#               cache goes with its process). DURATION=150s leaves time to see the rate come back
#               (vLLM restarts in 50-90 s); PREFIXES (default 12) widens the working set: with 12 the
#               offloading cache refills in seconds, so surviving pages show little (2026-12-05: both
#               back at their rate within 6 s; OrbitKV 24% more completions in the first 10 s).
#               PREFIXES=24 (8 each of 1K/4K/8K: 106K tokens, 15.7 GB of Qwen3-8B KV) still fits the
#               16 GiB of either cache and is 6.5x the HBM: the run that shows what surviving is worth
#   report      bench report over every run so far
# TRACE_STARTUP=S traces each vLLM start (scripts/gpu/startup-trace/sitecustomize.py: Triton compiles hit or
# miss with their cache dir, the warm-up's phases, every thread's stack each S s during warmup_kernels) into
# $O/startup-trace.log; after every start a [startup cache] line says which Triton kernels that start
# compiled. Traced on 2026-12-06: the second vLLM start of a fresh machine spends ~11 s compiling vLLM's
# sampler kernels into ~/.triton/cache (the first puts them in inductor's cache dir), whatever its
# connector: run the restart mode after two starts (e.g. after a sustained pair), or one config pays it.
# CONN_EXTRA (a JSON object, e.g. '{"layerwise": true}') is merged into the connector's
# kv_connector_extra_config of the dram/ssd runs, and labels them conn_extra=... (keep such runs
# in a session of their own: bench report compares by config label). QUERY_BUDGET (default 2GiB)
# is the peer's --query-budget-bytes, labelled query_budget=... when set; PEER_FLAGS (e.g.
# --ssd-no-readmit) are added to every peer's flags, labelled peer_flags=... when set.
# Every step has its own timeout; logs land in $OUT (at most 8 files come back).
set -u
. "$(dirname "$0")/lib.sh"
gpu_env
O=${OUT:-/tmp/orbitkv-gpu-out}
K=${OKV_DIR:-/root/okv} # OKV_DIR: only for a dry run of the carry steps off the GPU machine
case ${VLLM:=0.26} in
0.26) VERSION=0.26.0 BUNDLE=vllm-site SITE=$K/site RUNS=$K/runs ;;
0.33) VERSION=0.33.0 BUNDLE=vllm033-site SITE=$K/site033 RUNS=$K/runs033 ;; # its own runs: bench report never mixes versions
*) echo "VLLM=$VLLM: 0.26 or 0.33" >&2; exit 2 ;;
esac
mkdir -p "$O" "$K" "$RUNS"
ROOT=$(pwd)
S=$O/summary.txt
MODEL=$ROOT/integration/models/qwen3-8b
VLLM_PID="" PEER_PID="" CFG_FLAGS="" EXTRA_PIDS=""
PORT=8000 # the port bench serving sends to; engines of the two-engine mode listen on 8001 and 8002

stop_all() { # the engines (process groups) and the proxy first, the peer last
	stop_groups $EXTRA_PIDS $VLLM_PID
	[ -n "$PEER_PID" ] && stop_groups "$PEER_PID"
	EXTRA_PIDS="" VLLM_PID="" PEER_PID=""
	wait_gpu_free # vLLM's EngineCore can outlive its API server for a moment
}
trap stop_all EXIT

carry() { # PART: move one carried part out of the repository folder (0.33: and its count file)
	carry_part "$BUNDLE" "$1" "$K" || return 1
	[ "$VLLM" = 0.26 ] && return 0
	cp ".gpucarry/$BUNDLE.parts" "$K/" || { say "no .gpucarry/$BUNDLE.parts carried"; return 1; }
	say "$(nparts) of $(cat "$K/$BUNDLE.parts") $BUNDLE part(s) under $K"
}

nparts() { ls "$K" | grep -c "^$BUNDLE\.part[0-9][0-9]\$"; } # not NAME.parts, the count file

complete() { [ -d "$SITE/vllm" ] || [ "$(nparts)" = "$(cat "$K/$BUNDLE.parts" 2>/dev/null)" ]; }

lmcache_unpack() { # LMCache 0.5.6 and the packages it needs beyond vLLM's (scripts/gpu/lmcache-bundle.sh)
	[ -d "$K/lmcache-site/lmcache" ] && return 0
	[ -f .gpucarry/lmcache-site.tar.xz ] || { say "lmcache: .gpucarry/lmcache-site.tar.xz not carried"; return 1; }
	mkdir -p "$K/lmcache-site" && python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='fully_trusted')" .gpucarry/lmcache-site.tar.xz "$K/lmcache-site" || return 1
	PYTHONPATH=$K/lmcache-site:$SITE python3 -c "import lmcache, lmcache.integration.vllm.vllm_v1_adapter as a; print('lmcache', lmcache.__file__)" 2>&1 | tail -3 | tee -a "$S"
}

unpack() {
	unpack_bundle "$BUNDLE" "$K" "$SITE" || return 1
	PYTHONPATH=$SITE python3 -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)" 2>&1 | tail -1 | tee -a "$S"
	[ "$VLLM" = 0.26 ] && return 0
	# bundles packed before 2026-12-06 lost the wheels' executable bits (unwheel): Triton's ptxas,
	# cuobjdump and nvdisasm must run, or every start fails in inductor with Permission denied
	chmod +x "$SITE"/triton/backends/nvidia/bin/* 2>/dev/null
	# 0.33's bundle zeroed every non-sm_90 cubin (vllm033-bundle.sh): one kernel each from libtorch_cuda,
	# cuBLASLt, vLLM's _C and FA3 must load and run, from the carried libraries, not the image's
	PYTHONPATH=$SITE timeout 300 python3 - <<'PY' 2>&1 | tail -8 | tee -a "$S"
import torch, vllm._C_stable_libtorch, vllm.vllm_flash_attn.flash_attn_interface as fa
a = torch.randn(512, 512, device="cuda", dtype=torch.bfloat16)
b = (a @ a).float().relu().sum().item()
print("torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(), "matmul ok", b > 0,
      "cublasLt", [l for l in open("/proc/self/maps").read().split() if "libcublasLt" in l][:1], "FA3", fa.FA3_AVAILABLE, fa.FA3_UNAVAILABLE_REASON)
x = torch.randn(16, 4096, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
torch.ops._C.rms_norm(y, x, torch.ones(4096, device="cuda", dtype=torch.bfloat16), 1e-6)
print("_C rms_norm ok", bool(torch.isfinite(y).all()))
q = torch.randn(128, 8, 128, device="cuda", dtype=torch.bfloat16)
cu = torch.tensor([0, 128], device="cuda", dtype=torch.int32)
o = fa.flash_attn_varlen_func(q, q, q, 128, cu, 128, cu, causal=True, fa_version=3)
print("fa3 out", tuple(o.shape), "finite", bool(torch.isfinite(o).all()))
PY
}

start_peer() { # CONFIG: dram | ssd | offload-okv
	local dir=/tmp/okv-$1 cuda=require
	rm -rf "$dir"
	local tier=(--dram-bytes 16GiB --ssd-bytes 0)
	[ "$1" = ssd ] && tier=(--dram-bytes 4GiB --ssd-bytes 16GiB --ssd-file-bytes 1GiB)
	# the tier's peer never touches the GPU: vLLM's own worker copies between HBM and its CPU pool
	[ "$1" = offload-okv ] && tier=(--dram-bytes $((16 - ${TIER_SPLIT_GIB:-8}))GiB --ssd-bytes 0) cuda=off
	env ${PEER_ENV:-} out/orbitkv serve --data-dir "$dir" --cuda $cuda --metrics-addr 127.0.0.1:9464 --query-budget-bytes "${QUERY_BUDGET:-2GiB}" "${tier[@]}" ${PEER_FLAGS:-} >>"$O/peer.log" 2>&1 &
	PEER_PID=$!
	wait_socket "$dir/orbitkv.sock" "$PEER_PID" 900 && return 0
	say "peer $1 not serving (ended, or not within 90 s)"
	tail -5 "$O/peer.log" | tee -a "$S"
	return 1
}

# 0.33 keeps one of the 1,024 blocks back (its null block): 16,384 tokens no longer fit one request
MAX_LEN=16384; [ "$VLLM" = 0.33 ] && MAX_LEN=16000
VLLM_FLAGS=(--load-format dummy --skip-tokenizer-init --dtype bfloat16 --max-model-len "$MAX_LEN" --block-size 16
	--num-gpu-blocks-override 1024 --max-num-batched-tokens 8192 --max-num-seqs 64 --enable-prefix-caching
	--attention-backend FLASH_ATTN --served-model-name qwen3-8b --port 8000 --disable-hybrid-kv-cache-manager)

orbitkv_cfg() { [ "$1" = dram ] || [ "$1" = ssd ] || [ "$1" = offload-okv ]; } # the configs with a peer

config_kv() { # CONFIG: KV (its vLLM flags) and KV_ENV (its environment); 1 for an unknown config
	KV=() KV_ENV=()
	local extra=${CONN_EXTRA:-}
	extra=${extra#\{}
	extra=${extra%\}}
	case $1 in
	native) ;;
	ceiling) KV=(--num-gpu-blocks-override 8192) ;; # the later flag wins: 131,072 tokens, the whole working set
	offload) KV=(--kv-offloading-backend native --kv-offloading-size "${OFFLOAD_GIB:-16}") ;;
	lmcache)
		KV_ENV=(LMCACHE_LOCAL_CPU=True LMCACHE_MAX_LOCAL_CPU_SIZE=16 LMCACHE_CHUNK_SIZE=256 LMCACHE_TRACK_USAGE=false DO_NOT_TRACK=1)
		KV=(--kv-transfer-config '{"kv_connector":"LMCacheConnectorV1","kv_role":"kv_both"}') ;;
	dram | ssd)
		KV=(--kv-transfer-config "{\"kv_connector\":\"OrbitKVConnector\",\"kv_connector_module_path\":\"orbitkv.vllm\",\"kv_role\":\"kv_both\",\"kv_load_failure_policy\":\"recompute\",\"kv_connector_extra_config\":{\"socket\":\"/tmp/okv-$1/orbitkv.sock\"${extra:+,$extra}}}") ;;
	offload-okv) # vLLM 0.33's offloading, TIER_SPLIT_GIB (8) in its CPU pool, OrbitKV as its secondary tier (the rest of 16)
		KV=(--kv-offloading-backend native --kv-offloading-size "${TIER_SPLIT_GIB:-8}" --kv-transfer-config
			"{\"kv_connector_extra_config\":{\"spec_name\":\"TieringOffloadingSpec\",\"secondary_tiers\":[{\"type\":\"OrbitKVTier\",\"module_path\":\"orbitkv.vllm_tier\",\"socket\":\"/tmp/okv-offload-okv/orbitkv.sock\"${TIER_OPTS:+,$TIER_OPTS}}]}}") ;;
	*) return 1 ;;
	esac
}

start_vllm() { # CONFIG [ENV=VALUE...]: native | ceiling | offload | lmcache | dram | ssd | offload-okv (0.33)
	# (ENGINE_PORT, GPU_UTIL and OFFLOAD_GIB override the port, memory share and offloading size)
	local cfg=$1
	shift
	local site=$SITE port=${ENGINE_PORT:-8000}
	local own=(--port "$port")
	[ -n "${GPU_UTIL:-}" ] && own+=(--gpu-memory-utilization "$GPU_UTIL")
	config_kv "$cfg" || { say "unknown config $cfg"; return 1; }
	[ "$cfg" = offload-okv ] && [ "$VLLM" != 0.33 ] && { say "offload-okv needs VLLM=0.33 (vLLM 0.33's secondary tiers)"; return 1; }
	if [ "$cfg" = lmcache ]; then
		lmcache_unpack || return 1
		site=$K/lmcache-site:$SITE
	fi
	local kv=("${KV[@]}") env=("${KV_ENV[@]}")
	CFG_FLAGS="${env[*]} ${kv[*]}"
	echo "=== $(date +%T) vllm $cfg $* ${VLLM_FLAGS[*]} ${kv[*]}" >>"$O/vllm.log"
	# the launch line goes to a file of its own, so that the restart mode can start the same engine again
	# TRACE_STARTUP=S: scripts/gpu/startup-trace/sitecustomize.py traces the start (Triton compiles hit/miss,
	# the warm-up phases, every thread's stack each S s during warmup_kernels) into $O/startup-trace.log
	local trace=() pp=$site:$ROOT/integration/python
	if [ -n "${TRACE_STARTUP:-}" ]; then
		trace=(ORBITKV_STARTUP_TRACE="$O/startup-trace.log" ORBITKV_STARTUP_TRACE_STACKS="$TRACE_STARTUP")
		pp=$ROOT/scripts/gpu/startup-trace:$pp
	fi
	local argv=(env "${env[@]}" "$@" "${trace[@]}" PYTHONPATH="$pp" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1
		VLLM_USE_FLASHINFER_SAMPLER=0 PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False
		python3 -m vllm.entrypoints.cli.main serve "$MODEL" "${VLLM_FLAGS[@]}" "${own[@]}" "${kv[@]}")
	{ printf 'exec'; printf ' %q' "${argv[@]}"; echo; } >"$K/launch-$port.sh"
	setsid bash "$K/launch-$port.sh" >>"$O/vllm.log" 2>&1 &
	VLLM_PID=$!
	local t0=$SECONDS
	wait_http "127.0.0.1:$port/health" "$VLLM_PID" 1500 && { say "vllm $cfg :$port up in $((SECONDS - t0)) s"; vllm_modes; startup_caches "$K/launch-$port.sh"; return 0; }
	say "vllm $cfg failed to start"
	grep -E "Error|error|Traceback" "$O/vllm.log" | tail -12 | tee -a "$S"
	return 1
}

startup_caches() { # LAUNCH-FILE: the Triton kernels this start compiled (cache entries newer than its launch file), per cache dir
	find /root/.cache/vllm /root/.triton \( -name "__grp__*.json" -o -name "*.so" \) -newer "$1" 2>/dev/null |
		awk -F/ '{d=$0; sub("/[^/]*/[^/]*$", "", d); k=$NF; sub("^__grp__", "", k); sub("[.]json$", "", k); sub("[.]cpython.*[.]so$", ".so", k); n[d]++; t++; l[d]=l[d] " " k}
			END{for (d in n) print "[startup cache] " n[d] " triton kernels/launchers compiled into " d ":" substr(l[d], 1, 600); if (!t) print "[startup cache] no triton kernel compiled"}' |
		tee -a "$S"
}

vllm_modes() { # which model runner and CUDA graph mode this start took (layer-wise loads depend on both)
	grep -hoE "Using V[0-9] Model Runner|Overriding cudagraph_mode[^.]*|'cudagraph_mode': <CUDAGraphMode\.[A-Z_]+" "$O/vllm.log" |
		tail -3 | sed "s/^/[vllm mode] /" | tee -a "$S"
}

bench() { # CFG NAME BENCH-ARGS...
	local cfg=$1 name=$2
	shift 2
	local pm=()
	orbitkv_cfg "$cfg" && pm=(--peer-metrics http://127.0.0.1:9464/metrics)
	fresh_run_dir "$RUNS/$name"
	timeout ${RUN_TIMEOUT:-240} out/orbitkv bench serving --endpoint http://127.0.0.1:$PORT --model qwen3-8b --vocab ${VOCAB:-151936} \
		--engine-metrics http://127.0.0.1:${METRICS_PORT:-$PORT}/metrics "${pm[@]}" --quiet --label config=${CFG_LABEL:-$cfg} --label engine=vllm-$VERSION \
		--label "engine_flags=${VLLM_FLAGS[*]}" --label "config_flags=${CFG_FLAGS:-}" ${CONN_EXTRA:+--label "conn_extra=$CONN_EXTRA"} \
		${QUERY_BUDGET:+--label "query_budget=$QUERY_BUDGET"} ${PEER_FLAGS:+--label "peer_flags=$PEER_FLAGS"} "$@" --output "$RUNS/$name" >>"$O/bench.log" 2>&1
	say "bench $name rc=$?"
	[ -f "$RUNS/$name/summary.json" ] && head -c 1200 "$RUNS/$name/summary.json" | tee -a "$S" && echo | tee -a "$S"
	for p in ${ENGINE_PORTS:-$PORT}; do
		curl -s --max-time 5 127.0.0.1:"$p"/metrics | grep -E "^vllm:(prefix_cache_(hits|queries)|external_prefix_cache_(hits|queries)|num_preemptions|prompt_tokens|prompt_tokens_cached_by_source)_total|^vllm:request_(queue|prefill|decode)_time_seconds_sum" |
			tag_lines "$name vllm:$p" | tee -a "$S"
	done
	orbitkv_cfg "$cfg" && curl -s --max-time 5 127.0.0.1:9464/metrics |
		grep -E "^orbitkv_fabric_(saved_pages|loaded_pages|lookup_hit_pages|lookup_miss_pages|lookup_budget_cut_pages|lookup_recompute_pages)_total|^orbitkv_tiers_(demoted|promoted)_pages_total|^orbitkv_tiers_dram_unflushed_drops_total|^orbitkv_tiers_flusher_busy_seconds_total|^orbitkv_tiers_readmitted_pages_total|^orbitkv_tiers_ssd_read_bytes_per_second|^orbitkv_transfer_gpu_(phase_seconds|batches)_total" |
		tag_lines "$name peer" | tee -a "$S"
	# the connector's restore-gate counters, from vLLM's periodic "KV Transfer metrics" lines
	# (and vLLM's own offloading's transfer counters, from the same lines)
	{ orbitkv_cfg "$cfg" || [ "$cfg" = offload ]; } && awk '/^=== /{n=NR} {l[NR]=$0} END{for(i=n;i<=NR;i++) print l[i]}' "$O/vllm.log" | grep -o "KV Transfer metrics: .*" | tail -3 | tag_lines "$name kv" | tee -a "$S"
	return 0
}

one() { # CFG NAME [ENV...] -- BENCH-ARGS...
	local cfg=$1 name=$2
	shift 2
	local env=()
	while [ $# -gt 0 ] && [ "$1" != -- ]; do env+=("$1"); shift; done
	shift
	if orbitkv_cfg "$cfg"; then start_peer "$cfg" || return 1; fi
	start_vllm "$cfg" "${env[@]}" || { stop_all; return 1; }
	bench "$cfg" "$name" "$@"
	stop_all
}

two_one() { # CFG NAME: two engines (:8001, :8002) behind a round-robin proxy on :8000, one bench run
	local cfg=$1 name=$2 p
	if orbitkv_cfg "$cfg"; then start_peer "$cfg" || return 1; fi
	for p in 8001 8002; do # one after the other: each start profiles the GPU's free memory
		ENGINE_PORT=$p GPU_UTIL=0.42 OFFLOAD_GIB=8 start_vllm "$cfg" || { stop_all; return 1; }
		EXTRA_PIDS="$EXTRA_PIDS $VLLM_PID" VLLM_PID=""
	done
	out/orbitkv route-proxy --round-robin --listen 127.0.0.1:8000 --engine e1=http://127.0.0.1:8001 \
		--engine e2=http://127.0.0.1:8002 >>"$O/proxy.log" 2>&1 &
	EXTRA_PIDS="$EXTRA_PIDS $!"
	for _ in $(seq 50); do grep -q listening "$O/proxy.log" 2>/dev/null && break; sleep 0.1; done
	CFG_LABEL=two-$cfg METRICS_PORT=8001 ENGINE_PORTS="8001 8002" bench "$cfg" "$name" "${SEEDS[@]}" --duration ${DURATION:-60s} "${DET[@]}" \
		--label pair=${PAIR:-1} --label order=${ORDER:-AB} --label shape=two-engines-one-gpu
	stop_all
}

restart_cmd() { # the command bench serving runs (sh -c) to kill the engine and start it again (after start_vllm)
	echo "$VLLM_PID" >"$K/vllm.pid"
	# run once the requests in flight are done; bench serving waits for the engine itself. It waits
	# (30 s at most) until no process but the peer holds the GPU: the peer is a CUDA process too, so
	# waiting for none (before 2026-12-05 22:00) added the whole 30 s to OrbitKV's restarts
	printf '%s' "kill -9 -\$(cat $K/vllm.pid); S=$S GPU_FREE_TRIES=150 bash -c '. $ROOT/scripts/gpu/lib.sh; wait_gpu_free $PEER_PID';"
	printf '%s' " touch $K/relaunch.mark; setsid bash $K/launch-8000.sh >>$O/vllm.log 2>&1 & echo \$! >$K/vllm.pid"
}

restarted() { # after a run with restart_cmd: the engine started again is the one stop_all must end
	[ -f "$K/relaunch.mark" ] || return 0
	EXTRA_PIDS="$(cat "$K/vllm.pid")" # (the first one, VLLM_PID, was killed)
}

restart() { # per config in RESTART_SEQ: the engine killed (-9) RESTART_AT into the window and started again
	# (runs in $RUNS/restarts: the sustained report refuses runs of another duration)
	local cfg
	for cfg in ${RESTART_SEQ:-offload dram}; do
		rm -f "$K/relaunch.mark"
		if orbitkv_cfg "$cfg"; then start_peer "$cfg" || continue; fi
		start_vllm "$cfg" || { stop_all; continue; }
		CFG_LABEL=restart-$cfg RUN_TIMEOUT=${RUN_TIMEOUT:-540} bench "$cfg" "restarts/$cfg-${PAIR:-1}" "${SEEDS[@]}" \
			--duration ${DURATION:-90s} --restart-at ${RESTART_AT:-30s} --restart-cmd "$(restart_cmd)" --restart-timeout 300s "${DET[@]}" \
			--label pair=${PAIR:-1} --label order=${ORDER:-AB} --label shape=engine-restart
		python3 -c "import json,sys; r=json.load(open(sys.argv[1])).get('restart') or {}; r.pop('completions_per_s', None); print('[restart-$cfg]', r)" \
			"$RUNS/restarts/$cfg-${PAIR:-1}/summary.json" 2>&1 | tee -a "$S"
		[ -f "$K/relaunch.mark" ] && echo "[startup cache] restart-$cfg:" | tee -a "$S" && startup_caches "$K/relaunch.mark"
		restarted
		stop_all
	done
}

two() {
	for cfg in ${TWO_SEQ:-offload dram}; do
		two_one "$cfg" "two-${cfg}-${PAIR:-1}"
	done
}

SEEDS=(--workload sustained --prefix-tokens ${PREFIX_TOKENS:-1024,4096,8192} --prefixes ${PREFIXES:-12} --reuse 0.75 --concurrency 8 --output-tokens 16)

sustained() {
	for cfg in ${SEQ:-native dram ssd}; do
		one "$cfg" "${cfg}-${PAIR:-1}" -- "${SEEDS[@]}" --duration ${DURATION:-60s} "${DET[@]}" --label pair=${PAIR:-1} --label order=${ORDER:-AB}
	done
}

probe() { # per config in PROBE_SEQ: 8K-token TTFT cold, resident, evicted (PROBE_RESTART=1: and after a restart)
	local cfg rs hooks
	for cfg in ${PROBE_SEQ:-dram}; do
		rm -f "$K/relaunch.mark"
		hooks=()
		if orbitkv_cfg "$cfg"; then
			start_peer "$cfg" || continue
			# the connector's per-step hook times (orbitkv.hooktrace), beside the run (not a NAME-<digit> dir)
			[ "${HOOK_TRACE:-1}" = 1 ] && hooks=(ORBITKV_HOOK_TRACE="$RUNS/probes/$cfg-${PAIR:-1}.hooks") &&
				rm -rf "$RUNS/probes/$cfg-${PAIR:-1}.hooks" # an earlier call's trace of the same PAIR
		fi
		start_vllm "$cfg" "${hooks[@]}" || { stop_all; continue; }
		rs=()
		[ "${PROBE_RESTART:-0}" = 1 ] && rs=(--restart-cmd "$(restart_cmd)" --restart-timeout 300s)
		[ "${PYSPY:-0}" = 1 ] && pyspy_start "$VLLM_PID" "$RUNS/probes/$cfg-${PAIR:-1}.pyspy"
		CFG_LABEL=$cfg RUN_TIMEOUT=${RUN_TIMEOUT:-540} bench "$cfg" "probes/$cfg-${PAIR:-1}" --workload probes --probe-tokens ${PROBE_TOKENS:-8192} \
			--probe-reps ${PROBE_REPS:-3} --filler-tokens 32768 "${rs[@]}" "${DET[@]}" --label pair=${PAIR:-1} --label order=${ORDER:-AB}
		pyspy_stop
		phases_line "probe-$cfg" "$RUNS/probes/$cfg-${PAIR:-1}"
		restarted
		stop_all
		[ -s "$RUNS/probes/$cfg-${PAIR:-1}.pyspy" ] && python3 scripts/gpu/pyspy-summary.py "$RUNS/probes/$cfg-${PAIR:-1}.pyspy" \
			--rate "${PYSPY_RATE:-200}" --threads 2 --top 8 2>&1 | head -${PYSPY_LINES:-40} | tag_lines "probe-$cfg py-spy" | tee -a "$S"
		# after the engine stopped: the trace's lines are buffered until its shutdown (orbitkv.hooktrace)
		[ ${#hooks[@]} -gt 0 ] && PYTHONPATH=$ROOT/integration/python python3 -m orbitkv.hooktrace "${hooks[0]#*=}" 2>&1 |
			head -${HOOK_LINES:-60} | tag_lines "probe-$cfg hooks" | tee -a "$S"
	done
	# their own folder and report: the sustained report refuses runs of another workload
	out/orbitkv bench report "$RUNS"/probes/*-[0-9] >"$O/probe-report.txt" 2>&1
	say "bench report (probes) rc=$?"
	tail -20 "$O/probe-report.txt" | tee -a "$S"
	(cd "$K" && tar czf "$O/runs.tgz" "${RUNS##*/}")
}

overhead() {
	for cfg in native dram; do
		one "$cfg" "overhead-$cfg" -- --workload sustained --prefix-tokens 48 --prefixes 12 --reuse 0 --concurrency 8 \
			--output-tokens 128 --duration 30s "${DET[@]}" --label pair=overhead
	done
}

invariant() {
	for cfg in ${INV_SEQ:-native dram ssd}; do
		one "$cfg" "invariant-$cfg" VLLM_BATCH_INVARIANT=1 -- "${SEEDS[@]}" --duration 30s --label pair=invariant --label mode=batch-invariant
	done
}

corrupt() { # the control: the peer's test-only hook flips one bit of every 20th restore's first page
	PEER_ENV=ORBITKV_TEST_CORRUPT_LOADS=20 one dram invariant-corrupt VLLM_BATCH_INVARIANT=1 -- "${SEEDS[@]}" --duration 30s \
		--label pair=corrupt --label mode=batch-invariant --deterministic=false
	grep -h '"mismatches"' "$RUNS/invariant-corrupt/summary.json" | sed 's/^/[corrupt] /' | tee -a "$S"
}

report() {
	out/orbitkv bench report "$RUNS"/*-[0-9] >"$O/report.txt" 2>&1
	say "bench report rc=$?"
	tail -40 "$O/report.txt" | tee -a "$S"
	cp "$RUNS/report/report.md" "$O/report.md" 2>/dev/null
	(cd "$K" && tar czf "$O/runs.tgz" "${RUNS##*/}")
}

if [ "${1:-}" = flags ]; then # flags CONFIG: vLLM's argv for it after `serve MODEL`, one a line (vllm-check.py, on a CPU)
	trap - EXIT
	config_kv "${2:-}" || { echo "unknown config ${2:-}" >&2; exit 2; }
	printf '%s\n' "${VLLM_FLAGS[@]}" "${KV[@]}"
	exit
fi
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee -a "$S"
unxz_bins orbitkv
# vLLM's default kernels are not batch invariant: label those runs non-deterministic (bench report
# then says so); checked after the unpack above, or the first call with out/orbitkv.xz misses the flag
DET=()
out/orbitkv bench serving --help 2>&1 | grep -q -- -deterministic && DET=(--deterministic=false)
case $VLLM:${1:-} in
0.26:carry1) carry 00; exit $? ;;
0.26:carry2) carry 01 && unpack || exit 1; shift ;;
0.33:carry[0-9][0-9])
	carry "${1#carry}" || exit 1
	shift
	complete || { [ $# -eq 0 ] || say "parts missing: modes $* not run"; exit 0; }
	unpack || exit 1
	;;
*:carry*) echo "VLLM=$VLLM: carry1/carry2 are 0.26's, carryNN 0.33's" >&2; exit 2 ;;
esac
for m in "$@"; do
	case $m in
	sustained | probe | overhead | invariant | corrupt | two | restart | report) $m ;;
	lmcache-check) lmcache_unpack ;; # unpack the carried LMCache site and try its vLLM adapter's import
	*) echo "usage: $0 carry1 | carry2 MODE... | MODE...; VLLM=0.33 $0 carryNN [MODE...] | MODE... (sustained probe overhead invariant corrupt two restart report lmcache-check)" >&2; exit 2 ;;
	esac
done
(cd "$K" && tar czf "$O/runs.tgz" "${RUNS##*/}")
tail -c 4000000 "$O/vllm.log" >"$O/vllm-tail.log" && rm -f "$O/vllm.log"
