#!/bin/sh
# The reference router (orbitkv route-proxy) beside its round-robin baseline
# (route-proxy --round-robin), in one run (issue 38): three hosts, each a
# network namespace on one bridge with an OrbitKV peer and a reference engine
# (python -m orbitkv.refengine, tiny preset, OrbitKV connector); the proxy and
# `orbitkv bench serving` (sustained workload) in this namespace. Each side
# gets fresh peers and engines, so neither restores what the other saved.
# Printed side by side: throughput, TTFT, failed requests, where the engines'
# prompt tokens came from (prefix cache, restored, computed), the pages the
# peers restored and how many of them were fetched from another host.
# Needs root, iproute2, curl and the Python the e2e tests use for the
# reference engine (ORBITKV_PYTHON, else /usr/bin/python3; scripts/install-deps.sh).
# Settings from the environment: ORDER (the sides, in order), DURATION,
# CONCURRENCY, PREFIXES, PREFIX_TOKENS, REUSE, KV_TOKENS, DRAM (each peer's
# DRAM tier), KEEP=1 (keep the work directory: runs and logs).
#   scripts/bench-router-netns.sh                      # routed, then round robin
#   ORDER="round-robin routed" DRAM=4MiB scripts/bench-router-netns.sh
# Extra arguments go to both `bench serving` runs (e.g. --seed 2).
set -eu
BIN=${ORBITKV_BIN:-bin/orbitkv}
PY=${ORBITKV_PYTHON:-/usr/bin/python3}
ORDER=${ORDER:-routed round-robin}
DURATION=${DURATION:-60s}
CONCURRENCY=${CONCURRENCY:-6}
PREFIXES=${PREFIXES:-12}
# The prefixes' first sends go round robin over the three hosts, so a cycle of
# lengths that is a multiple of 3 would put every longest prefix on one host.
PREFIX_TOKENS=${PREFIX_TOKENS:-512,1024,1536,2048}
REUSE=${REUSE:-0.75}
KV_TOKENS=${KV_TOKENS:-4096} # each engine's KV pool: the prefixes do not all fit in one
DRAM=${DRAM:-256MiB}         # each peer's DRAM tier (a 64-token page of the tiny preset is 32 KiB)
PAGE_TOKENS=64
P=okv-brt
NET=10.75.0
PROXY=$NET.254:8100
LAYOUT='{"model":"refengine/tiny","revision":"refengine-seed-0","dtype":"fp32","num_layers":2,"kv_heads":2,'
LAYOUT=$LAYOUT'"head_dim":16,"tp_rank":0,"tp_size":1,"page_tokens":'$PAGE_TOKENS',"byte_layout":"vllm-flash"}'
ROOT=$(cd "$(dirname "$0")/.." && pwd)
case $BIN in /*) ;; *) BIN=$ROOT/$BIN ;; esac
DIR=$(mktemp -d /tmp/okv-bench-router.XXXXXX)
PIDS=

say() { echo "bench-router: $*" >&2; }

# stop PID...: TERM, then KILL what is still there after 10 s.
stop() {
  for pid in "$@"; do kill "$pid" 2>/dev/null || true; done
  for pid in "$@"; do
    n=0
    while kill -0 "$pid" 2>/dev/null; do
      n=$((n + 1))
      [ $n -lt 100 ] || { kill -9 "$pid" 2>/dev/null || true; break; }
      sleep 0.1
    done
  done
}

cleanup() {
  rc=$?
  # shellcheck disable=SC2086
  stop $PIDS
  if [ $rc != 0 ] && [ -d "$DIR" ]; then
    for f in "$DIR"/*/*.log "$DIR"/*/*.out; do
      [ -s "$f" ] && { echo "--- $f" && tail -5 "$f"; } >&2
    done
  fi
  for n in a b c sw; do ip netns del $P-$n 2>/dev/null || true; done
  ip link del $P-p0 2>/dev/null || true
  [ -n "${KEEP:-}" ] || rm -rf "$DIR"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# wait_until SECONDS PID WHAT CMD...: run CMD every 0.2 s until it succeeds;
# fail when PID (0: none) has exited or SECONDS have passed.
wait_until() {
  end=$(($(date +%s) + $1)) pid=$2 what=$3
  shift 3
  until "$@"; do
    if [ "$pid" != 0 ] && ! kill -0 "$pid" 2>/dev/null; then
      say "$what: its process exited"
      return 1
    fi
    if [ "$(date +%s)" -ge "$end" ]; then
      say "$what: not within the deadline"
      return 1
    fi
    sleep 0.2
  done
}

# metric URL SERIES: the value of one series of a /metrics page (0 if absent).
metric() {
  curl -sf --max-time 5 "$1" | awk -v s="$2" '$1 == s { v = $2 } END { print v + 0 }'
}

members3() { [ "$(metric "http://$1:9464/metrics" orbitkv_cluster_members)" = 3 ]; }
listening() { grep -q "$2" "$1" 2>/dev/null; }

for tool in ip curl; do command -v $tool >/dev/null || { say "needs $tool (scripts/install-deps.sh)"; exit 1; }; done
[ "$(id -u)" = 0 ] || { say "needs root (network namespaces)"; exit 1; }
[ -x "$BIN" ] || { say "no $BIN (make build)"; exit 1; }
"$PY" -c 'import torch, grpc' || { say "$PY cannot import torch and grpc (scripts/install-deps.sh, or set ORBITKV_PYTHON)"; exit 1; }
for side in $ORDER; do
  case $side in routed | round-robin) ;; *) say "ORDER: want routed and round-robin, got $side"; exit 1 ;; esac
done

cleanup
mkdir -p "$DIR"
ip netns add $P-sw
ip -n $P-sw link add br0 type bridge
ip -n $P-sw link set br0 up
i=0
for n in a b c; do
  i=$((i + 1))
  ip netns add $P-$n
  ip link add $P-h$n type veth peer name $P-s$n
  ip link set $P-h$n netns $P-$n
  ip -n $P-$n link set $P-h$n name eth0
  ip -n $P-$n addr add $NET.$i/24 dev eth0
  ip -n $P-$n link set eth0 up
  ip -n $P-$n link set lo up
  ip link set $P-s$n netns $P-sw
  ip -n $P-sw link set $P-s$n master br0 up
done
# This namespace (the proxy and the load generator) reaches the hosts over the bridge.
ip link add $P-p0 type veth peer name $P-p1
ip link set $P-p1 netns $P-sw
ip -n $P-sw link set $P-p1 master br0 up
ip addr add $NET.254/24 dev $P-p0
ip link set $P-p0 up

# sum PORT SERIES...: the series summed over the three hosts' /metrics on PORT
# ("?" if a host did not answer).
sum() {
  port=$1
  shift
  for i in 1 2 3; do curl -sf --max-time 5 "http://$NET.$i:$port/metrics" || echo "unreachable"; done |
    awk -v s=" $* " '$1 == "unreachable" { bad = 1 } index(s, " " $1 " ") { v += $2 } END { if (bad) print "?"; else printf "%d\n", v }'
}

# side NAME [ARGS...]: fresh peers, engines and proxy, then the bench with
# ARGS added; its counters go to $DIR/NAME.env, its run to $DIR/NAME/run.
side() {
  name=$1
  shift
  S=$DIR/$name
  mkdir -p "$S"
  say "$name: starting three peers"
  peers='' i=0
  for n in a b c; do
    i=$((i + 1))
    join=
    [ $n = a ] || join="--cluster-join $NET.1:7946"
    # shellcheck disable=SC2086
    ip netns exec $P-$n "$BIN" serve --data-dir "$S/$n" --cluster-addr $NET.$i:7946 --node-name host-$n \
      --cluster-insecure --metrics-addr $NET.$i:9464 --dram-bytes "$DRAM" --dram-slab-bytes 1MiB --ssd-bytes 0 $join 2>"$S/peer-$n.log" &
    peers="$peers $!"
    PIDS="$PIDS $!"
  done
  i=0
  for pid in $peers; do
    i=$((i + 1))
    n=$(echo abc | cut -c$i)
    wait_until 30 "$pid" "peer host-$n's socket" test -S "$S/$n/orbitkv.sock"
    wait_until 30 "$pid" "3 members on host-$n" members3 $NET.$i
  done
  say "$name: starting three reference engines"
  engines='' i=0
  for n in a b c; do
    i=$((i + 1))
    (cd "$ROOT/integration/python" && exec ip netns exec $P-$n "$PY" -m orbitkv.refengine --host $NET.$i --port 8000 \
      --preset tiny --kv-tokens "$KV_TOKENS" --block-size 16 --page-tokens $PAGE_TOKENS --request-timeout-s 120 \
      --connector orbitkv --orbitkv-socket "$S/$n/orbitkv.sock" \
      --connector-extra "{\"engine_id\":\"engine-$n\",\"timeout_s\":5}") >"$S/engine-$n.out" 2>"$S/engine-$n.log" &
    engines="$engines $!"
    PIDS="$PIDS $!"
  done
  i=0
  for pid in $engines; do
    i=$((i + 1))
    n=$(echo abc | cut -c$i)
    wait_until 120 "$pid" "engine on host-$n" listening "$S/engine-$n.out" "refengine listening on http://$NET.$i:8000"
  done
  mode="--layout $LAYOUT"
  [ "$name" = routed ] || mode=--round-robin
  # shellcheck disable=SC2086
  "$BIN" route-proxy --listen $PROXY --peer $NET.1:9464 $mode \
    --engine host-a=http://$NET.1:8000 --engine host-b=http://$NET.2:8000 --engine host-c=http://$NET.3:8000 \
    >"$S/proxy.out" 2>&1 &
  proxy=$!
  PIDS="$PIDS $proxy"
  wait_until 10 $proxy "route-proxy" listening "$S/proxy.out" "route-proxy listening on http://$PROXY"
  say "$name: bench serving through route-proxy for $DURATION"
  rc=0
  "$BIN" bench serving --quiet --endpoint "http://$PROXY" --vocab 512 --prefixes "$PREFIXES" \
    --prefix-tokens "$PREFIX_TOKENS" --reuse "$REUSE" --concurrency "$CONCURRENCY" --duration "$DURATION" \
    --output-tokens 16 --request-timeout 120s --label config="$name" --output "$S/run" "$@" >"$S/bench.out" 2>&1 || rc=$?
  [ $rc = 0 ] || { say "$name: bench serving exited $rc:"; tail -5 "$S/bench.out" >&2; }
  {
    echo "bench_rc=$rc"
    # A page fetched from another host lands in this host's DRAM and is loaded from there.
    for t in dram ssd; do echo "pages_$t=$(sum 9464 "orbitkv_fabric_loaded_pages_total{tier=\"$t\"}")"; done
    echo "fetched=$(sum 9464 'orbitkv_cluster_fetched_pages_total{result="ok"}')"
    echo "fetch_failed=$(sum 9464 'orbitkv_cluster_fetched_pages_total{result="missing"}' \
      'orbitkv_cluster_fetched_pages_total{result="corrupt"}' 'orbitkv_cluster_fetched_pages_total{result="failed"}')"
    for k in prompt_tokens prefix_cache_hit_tokens external_restored_tokens computed_prompt_tokens load_error_blocks; do
      echo "$k=$(sum 8000 "orbitkv_refengine_${k}_total")"
    done
    echo "by_host=$(for i in 1 2 3; do curl -sf --max-time 5 "http://$NET.$i:8000/metrics" |
      awk '$1 == "orbitkv_refengine_prompt_tokens_total" { printf "%d", $2 }'; [ $i = 3 ] || printf /; done)"
  } >"$DIR/$name.env"
  stop "$proxy"
  # shellcheck disable=SC2086
  stop $engines
  # shellcheck disable=SC2086
  stop $peers
  echo "proxy=$(grep '^route-proxy: ' "$S/proxy.out" | cut -c14-)" >>"$DIR/$name.env"
  PIDS=
}

say "hosts host-a/b/c at $NET.1-3 (namespaces $P-a/b/c on one bridge), proxy and load at $NET.254; work dir $DIR"
for s in $ORDER; do side "$s" "$@"; done

# Side by side, from each run's summary.json and the counters.
# shellcheck disable=SC2086
"$PY" - "$DIR" $ORDER <<'EOF'
import json, os, sys
d, sides = sys.argv[1], sys.argv[2:]
sums, env = {}, {}
for s in sides:
    try:
        sums[s] = json.load(open(f"{d}/{s}/run/summary.json"))
    except OSError:
        sums[s] = {}
    env[s] = dict(l.rstrip("\n").split("=", 1) for l in open(f"{d}/{s}.env"))
def pct(xs, p):  # nearest rank, as bench serving's summary
    xs = sorted(xs)
    return xs[max(0, -(-len(xs) * p // 100) - 1)] if xs else float("nan")
ttft = {}
for s in sides:
    ttft[s] = {True: [], False: []}
    try:
        for line in open(f"{d}/{s}/run/requests.jsonl"):
            r = json.loads(line)
            if not r.get("error"):
                ttft[s][bool(r.get("reuse"))].append(r["ttft_ms"])
    except OSError:
        pass
def by_reuse(s, reuse):
    xs = ttft[s][reuse]
    return f"{pct(xs, 50):.0f} / {pct(xs, 90):.0f} (n={len(xs)})"
def share(s, k):
    tot, v = env[s]["prompt_tokens"], env[s][k]
    if not tot.isdigit() or not v.isdigit() or tot == "0":
        return v
    return f"{v} ({100 * int(v) / int(tot):.1f}%)"
rows = [
    ("status", lambda s: sums[s].get("status", "no summary")),
    ("requests completed", lambda s: sums[s].get("completed", "?")),
    ("requests failed", lambda s: sums[s].get("failed", "?")),
    ("outputs differing from reference", lambda s: sums[s].get("mismatches", "?")),
    ("throughput, req/s", lambda s: f"{sums[s].get('throughput_rps', 0):.2f}"),
    ("prompt tokens/s", lambda s: f"{sums[s].get('prompt_tok_s', 0):.0f}"),
    ("TTFT p50, ms", lambda s: f"{sums[s].get('ttft_ms', {}).get('p50', 0):.0f}"),
    ("TTFT p90, ms", lambda s: f"{sums[s].get('ttft_ms', {}).get('p90', 0):.0f}"),
    ("  reused prefix: p50 / p90", lambda s: by_reuse(s, True)),
    ("  new prompt: p50 / p90", lambda s: by_reuse(s, False)),
    ("engines' prompt tokens", lambda s: env[s]["prompt_tokens"]),
    ("  on host a/b/c", lambda s: env[s]["by_host"]),
    ("  from their prefix cache", lambda s: share(s, "prefix_cache_hit_tokens")),
    ("  restored by the peers", lambda s: share(s, "external_restored_tokens")),
    ("  computed", lambda s: share(s, "computed_prompt_tokens")),
    ("pages the peers restored (DRAM)", lambda s: env[s]["pages_dram"]),
    ("  of them fetched from another host", lambda s: env[s]["fetched"]),
    ("fetches missing/corrupt/failed", lambda s: env[s]["fetch_failed"]),
    ("load-error blocks (recomputed)", lambda s: env[s]["load_error_blocks"]),
]
w = max(len(r[0]) for r in rows) + 2
cw = max(22, max(len(s) for s in sides) + 2)
print()
print("".ljust(w) + "".join(s.ljust(cw) for s in sides))
for name, f in rows:
    print(name.ljust(w) + "".join(str(f(s)).ljust(cw) for s in sides))
print()
for s in sides:
    print(f"{s}: route-proxy: {env[s].get('proxy') or '?'}")
print("Counters cover each side's whole run (the serial first sends of the prefixes included);")
print("throughput and TTFT cover the window.", f"Runs and logs: {d} (kept)" if os.environ.get("KEEP") else "KEEP=1 keeps the runs and logs.")
bad = [s for s in sides if env[s]["bench_rc"] != "0"]
if bad:
    print("bench serving failed on:", ", ".join(bad))
    sys.exit(1)
EOF
