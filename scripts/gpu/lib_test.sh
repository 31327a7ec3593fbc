#!/bin/bash
# Tests of scripts/gpu/lib.sh off the GPU machine (make test-scripts): every GPU script parses (and is
# executable where it has a #! line); a
# bundle carried in parts unpacks byte for byte and a corrupted part is refused; carried binaries
# unpack; a process group that ignores TERM is stopped; the GPU, socket and HTTP waits end when what
# they wait for appears or their process ends.
set -u
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
W=$(mktemp -d /tmp/okv-gpulib.XXXXXX)
trap 'rm -rf "$W"' EXIT
O=$W/out S=$W/summary.txt
. scripts/gpu/lib.sh
fails=0
ok() { echo "ok   $*"; }
bad() { echo "FAIL $*"; fails=$((fails + 1)); }

for f in scripts/gpu/*.sh; do bash -n "$f" && ok "parses: $f" || bad "does not parse: $f"; done
# A script with a #! line is run by its path (scripts/gpu/vllm.sh carry1 on the GPU machine, whose copy
# of the tree keeps git's modes): it must be executable; lib.sh and wheels.sh are sourced.
for f in scripts/gpu/*.sh; do
	head -1 "$f" | grep -q '^#!' || continue
	[ -x "$f" ] && ok "executable: $f" || bad "has a #! line but is not executable (git update-index --chmod=+x): $f"
done

# unwheel keeps a wheel's executable bits (triton's ptxas lost its own on 2026-12-06 and every vLLM 0.33
# start on the GPU failed with Permission denied) and gives no other file one.
(. scripts/gpu/wheels.sh && python3 - "$W/t-1.0-py3-none-any.whl" <<'PY' && unwheel "$W/wsite" "$W/t-*.whl") || bad "unwheel ran"
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    for name, mode in (("t/bin/ptxas", 0o755), ("t/__init__.py", 0o644)):
        i = zipfile.ZipInfo(name)
        i.external_attr = (0o100000 | mode) << 16
        z.writestr(i, "x")
PY
[ -x "$W/wsite/t/bin/ptxas" ] && ok "unwheel keeps an executable bit" || bad "unwheel dropped ptxas's executable bit"
[ -f "$W/wsite/t/__init__.py" ] && [ ! -x "$W/wsite/t/__init__.py" ] && ok "unwheel makes no other file executable" || bad "unwheel: __init__.py missing or executable"

# A second run under the same name keeps the first beside it, out of bench report's NAME-<digit> glob.
mkdir -p "$W/runs/dram-1" && echo first >"$W/runs/dram-1/summary.json"
fresh_run_dir "$W/runs/dram-1" && fresh_run_dir "$W/runs/dram-1"
kept=$(ls -d "$W"/runs/dram-1.replaced-* 2>/dev/null)
[ ! -e "$W/runs/dram-1" ] && [ "$(cat "$kept/summary.json" 2>/dev/null)" = first ] && ok "fresh_run_dir keeps an earlier run aside" ||
	bad "fresh_run_dir: the earlier run is gone or still in place"
(cd "$W/runs" && ls -d *-[0-9] 2>/dev/null | grep -q .) && bad "fresh_run_dir: the kept run matches bench report's glob" ||
	ok "fresh_run_dir: the kept run is outside bench report's glob"

# A probe run's phases as one summary line; a run that left no summary says so instead.
mkdir -p "$W/runs/probes/dram-1"
echo '{"phases_ttft_ms": {"cold": {"p50": 212.25}, "restart": {"p50": 61.04}}}' >"$W/runs/probes/dram-1/summary.json"
line=$(S=$W/phases.txt phases_line probe-dram "$W/runs/probes/dram-1")
[ "$line" = "[probe-dram] TTFT p50 ms {'cold': 212.2, 'restart': 61.0}" ] && grep -qF "$line" "$W/phases.txt" &&
	ok "phases_line prints and logs a probe run's phases" || bad "phases_line: got '$line'"
line=$(S=$W/phases.txt phases_line probe-ssd "$W/runs/probes/ssd-1")
case $line in *"No such file"*) ok "phases_line says a run left no summary" ;; *) bad "phases_line on a missing run: '$line'" ;; esac

# Counter lines tagged with a probe run's name, which holds a "/".
got=$(printf 'a 1\nb 2\n' | tag_lines "probes/dram-1 peer" 2>&1)
[ "$got" = "$(printf '[probes/dram-1 peer] a 1\n[probes/dram-1 peer] b 2')" ] &&
	ok "tag_lines tags every line, the label's / included" || bad "tag_lines: got '$got'"

# A bundle in two parts, carried one call at a time, then joined, checked and unpacked.
mkdir -p "$W/repo/.gpucarry" "$W/src/pkg" && cd "$W/repo"
head -c 300000 /dev/urandom >"$W/src/pkg/data.bin"
tar -C "$W/src" -cJf "$W/b.tar.xz" pkg && split -b 200000 -d -a 2 "$W/b.tar.xz" .gpucarry/b.part
(cd "$W" && sha256sum b.tar.xz) >.gpucarry/b.sha256
cp .gpucarry/b.part01 "$W/part01.copy"
carry_part b 00 "$W/k" && carry_part b 01 "$W/k" || bad "carry_part"
[ ! -e .gpucarry/b.part00 ] && [ -f "$W/k/b.part00" ] && ok "a carried part leaves the repository" || bad "part not moved"
unpack_bundle b "$W/k" "$W/k/site" && cmp -s "$W/src/pkg/data.bin" "$W/k/site/pkg/data.bin" &&
	ok "the bundle unpacks byte for byte" || bad "unpacked bytes differ"
ls "$W/k" | grep -q 'part\|tar.xz' && bad "parts or the joined archive left behind" || ok "parts and archive removed"
unpack_bundle b "$W/k" "$W/k/site" && ok "a second unpack finds the site and does nothing" || bad "second unpack"

cp "$W/k/b.sha256" .gpucarry/ && head -c 200000 "$W/b.tar.xz" >.gpucarry/b.part00 && cp "$W/part01.copy" .gpucarry/b.part01
# flip byte 100's bits (writing a fixed byte was no change when the byte held it already: CI, 2026-12-06)
python3 -c 'import sys; p = sys.argv[1]; b = bytearray(open(p, "rb").read()); b[100] ^= 0xFF; open(p, "wb").write(b)' .gpucarry/b.part01
carry_part b 00 "$W/k2" >/dev/null && carry_part b 01 "$W/k2" >/dev/null
if unpack_bundle b "$W/k2" "$W/k2/site" >/dev/null; then bad "a corrupted part was unpacked"; else
	[ ! -e "$W/k2/site" ] && [ ! -e "$W/k2/site.tmp" ] && ok "a corrupted part is refused, no site made" || bad "site left after a refusal"
fi
grep -q "checksum FAILED" "$S" && ok "the refusal is in the summary" || bad "no refusal line"

# Carried binaries.
mkdir -p out && printf '#!/bin/sh\necho carried\n' >out/tool && xz -f out/tool
unxz_bins tool && [ "$(out/tool)" = carried ] && ok "a carried binary unpacks and runs" || bad "unxz_bins"
echo 'echo stale' >>out/tool && touch out/tool && unxz_bins tool && [ "$(out/tool | tail -1)" = stale ] &&
	ok "a binary newer than its .xz is kept" || bad "unxz_bins overwrote a newer binary"
cd "$ROOT"

# A process group whose leader ignores TERM, and a child of it, are stopped.
setsid bash -c 'trap "" TERM; sleep 300 & wait' &
g=$!
for _ in $(seq 50); do pgrep -g "$g" sleep >/dev/null && break; sleep 0.1; done
child=$(pgrep -g "$g" sleep)
STOP_TENTHS=5 stop_groups "$g"
# Dead, or a zombie its parent has not reaped yet (this shell reaps g when it gets to it): no
# sleep, so a loaded machine cannot fail it.
gone() { local st; st=$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null); [ -z "$st" ] || [ "$st" = Z ]; }
gone "$g" && gone "$child" && ok "stop_groups ends a group that ignores TERM" ||
	bad "group $g still alive"
sleep 300 &
p=$!
for _ in $(seq 50); do grep -q sleep "/proc/$p/cmdline" 2>/dev/null && break; sleep 0.1; done # exec'd: a TERM before it can be lost
stop_groups "$p" && ! kill -0 "$p" 2>/dev/null && ok "stop_groups ends a plain process" || bad "plain process alive"

# Waits: for a socket that appears, for a process that ends first, for an HTTP endpoint.
python3 -c 'import socket,sys,time; s=socket.socket(socket.AF_UNIX); s.bind(sys.argv[1]); s.listen(); time.sleep(30)' "$W/s.sock" &
p=$!
wait_socket "$W/s.sock" "$p" 600 && ok "wait_socket sees the socket" || bad "wait_socket missed the socket"
kill "$p"
sh -c 'exit 0' &
p=$!
wait_socket "$W/never.sock" "$p" 600 && bad "wait_socket said yes to a socket that never came" || ok "wait_socket ends with its process"
python3 -c '
import http.server, socketserver
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self): self.send_response(200 if self.path == "/health" else 404); self.end_headers()
    def log_message(self, *a): pass
with socketserver.TCPServer(("127.0.0.1", 0), H) as s:
    open("'"$W"'/port", "w").write(str(s.server_address[1])); s.serve_forever()' &
p=$!
for _ in $(seq 100); do [ -s "$W/port" ] && break; sleep 0.1; done
wait_http "127.0.0.1:$(cat "$W/port")/health" "$p" 100 && ok "wait_http sees the endpoint" || bad "wait_http missed the endpoint"
kill "$p"
wait "$p" 2>/dev/null
wait_http "127.0.0.1:$(cat "$W/port")/health" "$p" 100 && bad "wait_http said yes after the server ended" || ok "wait_http ends with its process"

# wait_gpu_free against a stand-in nvidia-smi (its real side runs on the GPU machine): a peer
# kept by PID does not hold the wait; an engine process does, until it is gone.
mkdir -p "$W/bin" && printf '#!/bin/sh\ncat "%s/apps" 2>/dev/null\n' "$W" >"$W/bin/nvidia-smi" && chmod +x "$W/bin/nvidia-smi"
printf '4242\n' >"$W/apps"
PATH="$W/bin:$PATH" GPU_FREE_TRIES=3 wait_gpu_free 4242 && ok "wait_gpu_free passes over the kept peer" || bad "the kept peer held wait_gpu_free"
printf '4242\n4343\n' >"$W/apps"
PATH="$W/bin:$PATH" GPU_FREE_TRIES=3 wait_gpu_free 4242 && bad "wait_gpu_free said free while an engine held the GPU" ||
	{ grep -q "held by 4343 after 3 looks" "$S" && ok "wait_gpu_free gives up on a holding engine and names it" || bad "no line naming the engine"; }
(sleep 0.3; printf '4242\n' >"$W/apps") &
PATH="$W/bin:$PATH" GPU_FREE_TRIES=200 wait_gpu_free 4242 && ok "wait_gpu_free ends once the engine is gone" || bad "wait_gpu_free missed the engine ending"
wait

# sglang.sh SGL_VERSION=0.5.23 off the GPU machine (OKV_DIR): its own bundle's parts, unpacked to
# sgl0523 only over the vLLM 0.33 site (site033), refused with the way to carry it when that is absent.
R=$W/repo-sgl && mkdir -p "$R/.gpucarry" "$R/scripts" "$W/s23/sglang" && cp -r "$ROOT/scripts/gpu" "$R/scripts/" && cd "$R"
echo "version = '0.5.23'" >"$W/s23/sglang/__init__.py"
tar -C "$W/s23" -cJf "$W/s23.tar.xz" sglang && (cd "$W" && sha256sum s23.tar.xz | sed 's/s23/sglang0523-site/') >.gpucarry/sglang0523-site.sha256
split -n 2 -d "$W/s23.tar.xz" .gpucarry/sglang0523-site.part && echo 2 >.gpucarry/sglang0523-site.parts
cp .gpucarry/sglang0523-site.part01 "$W/s23.part01"
sgl() { OKV_DIR=$W/k23 OUT=$W/o23 SGL_VERSION=0.5.23 PATH="$W/bin:$PATH" bash scripts/gpu/sglang.sh "$@" >>"$W/sgl.log" 2>&1; }
printf '' >"$W/apps" # the stand-in nvidia-smi: no GPU process
sgl carry00 && grep -q "1 of 2 sglang 0.5.23 part(s)" "$W/o23/summary.txt" && ok "sglang.sh 0.5.23 carries a part of its own bundle" || bad "0.5.23 carry00"
sgl carry01 && bad "0.5.23 unpacked with no vLLM 0.33 site" ||
	{ grep -q "no vLLM site at $W/k23/site033: run VLLM=0.33" "$W/o23/summary.txt" && ok "sglang.sh 0.5.23 refuses without the vLLM 0.33 site, saying how to carry it" || bad "no line naming the missing site033"; }
mkdir -p "$W/k23/site033/vllm" && cp "$W/s23.part01" .gpucarry/sglang0523-site.part01
sgl carry01 && [ -f "$W/k23/sgl0523/sglang/__init__.py" ] && [ ! -e "$W/k23/sgl" ] && ok "sglang.sh 0.5.23 unpacks to sgl0523 over site033" || bad "0.5.23 unpack (log: $(tail -3 "$W/sgl.log"))"
cd "$ROOT"

# pyspy_install takes py-spy's binary out of a carried wheel; pyspy-summary.py reads py-spy's raw lines
# (the shape a real `py-spy record --subprocesses --threads --format raw` wrote, 2026-12-06): per
# process its busiest threads, frames by inclusive time (once per stack), the frames matching --match.
mkdir -p "$W/pyspy-repo/.gpucarry/pyspy" && python3 - "$W/pyspy-repo/.gpucarry/pyspy/py_spy-0.4.1-py2.py3-none-manylinux1_x86_64.whl" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1], "w") as z:
    z.writestr("py_spy-0.4.1.data/scripts/py-spy", "#!/bin/sh\necho py-spy 0.4.1\n")
PY
(cd "$W/pyspy-repo" && K=$W/kspy pyspy_install) && [ "$("$W/kspy/pyspy/py-spy")" = "py-spy 0.4.1" ] &&
	ok "pyspy_install unpacks the carried wheel's binary" || bad "pyspy_install"
(cd "$W" && K=$W/knone pyspy_install) && bad "pyspy_install without a wheel succeeded" || ok "pyspy_install without a wheel says so"
P='process 7:"python3 -m vllm serve"' E='process 9:"VLLM::EngineCore"'
cat >"$W/prof.raw" <<RAW
$P;thread (7): MainThread;serve (cli.py:1);loop (a.py:2) 40
$E;thread (9): MainThread;run (core.py:5);step (core.py:9);schedule (s.py:3);get_num_new_matched_tokens (orbitkv/vllm/connector.py:200);lookup (orbitkv/client.py:9) 30
$E;thread (9): MainThread;run (core.py:5);step (core.py:9);execute_model (r.py:4);step (core.py:9) 60
$E;thread (11): Thread-2 (saves);_save (orbitkv/vllm/worker.py:3) 10
$E;thread (12): idle;poll (x.py:1) 1
RAW
out=$(python3 scripts/gpu/pyspy-summary.py "$W/prof.raw" --rate 100 --threads 2 --top 3 --match orbitkv)
echo "$out" | grep -q '^process 9 VLLM::EngineCore | thread (9): MainThread: 0.90 s running$' &&
	echo "$out" | grep -qE '^ +900.0 ms  step \(core.py:9\)$' && echo "$out" | grep -qE '^ +300.0 ms  lookup \(orbitkv/client.py:9\)$' &&
	echo "$out" | grep -qE '^ +100.0 ms  _save' && ! echo "$out" | grep -q 'idle' &&
	echo "$out" | grep -q '^process 7 python3 -m vllm serve | thread (7): MainThread: 0.40 s running$' &&
	ok "pyspy-summary: threads by CPU, frames once per stack, matches, the two busiest threads" || { bad "pyspy-summary"; echo "$out"; }

[ $fails -eq 0 ] && echo "scripts/gpu/lib.sh: all passed" || echo "scripts/gpu/lib.sh: $fails failed"
exit $((fails > 0))
