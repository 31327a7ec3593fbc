# scripts/gpu/lib.sh: what the GPU-machine scripts share (sourced, never run): the summary log,
# the carried binaries, carried bundles in parts, process groups stopped with a deadline, waits
# for a socket or an HTTP endpoint. Tested off the GPU by scripts/gpu/lib_test.sh (make test).
#
# A script sets O (its output folder, $OUT on the device machine) and S (the summary file) first.

# gpu_env: the environment every GPU script runs under (no NVLink multicast: the device README).
gpu_env() {
	export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
}

# say MESSAGE...: a timestamped line to the terminal and the summary.
say() { echo "== $(date +%T) $*" | tee -a "$S"; }

# phases_line LABEL RUN_DIR: a probe run's TTFT p50 per phase (cold, resident, evicted, restart, filler)
# as one summary line, from its summary.json; says so when the run left none.
phases_line() {
	python3 -c 'import json, sys
p = json.load(open(sys.argv[2] + "/summary.json")).get("phases_ttft_ms") or {}
print("[%s] TTFT p50 ms" % sys.argv[1], {k: round(v["p50"], 1) for k, v in sorted(p.items())})' "$1" "$2" 2>&1 |
		tail -1 | tee -a "$S"
}

# tag_lines LABEL: stdin with "[LABEL] " before each line. LABEL may hold "/" (probe runs are
# named probes/CFG-N: a sed "s/^/[...]/" there failed and dropped their counters, 2026-12-06).
tag_lines() {
	awk -v t="[$1] " '{print t $0}'
}

# fresh_run_dir DIR: DIR absent, for a bench run. An earlier run there is kept beside it as
# DIR.replaced-HHMMSS (bench report reads only NAME-<digit> directories, so it reads the new run
# alone) and a line says so: two calls labelled with the same PAIR lost the first call's runs on
# 2026-12-06 (eighth H100 session; only its output kept the figures).
fresh_run_dir() {
	[ -e "$1" ] || return 0
	local kept
	kept="$1.replaced-$(date +%H%M%S)"
	mv "$1" "$kept" && say "kept the earlier run $(basename "$1") as $(basename "$kept"): give each call its own PAIR"
}

# unxz_bins NAME...: out/NAME from a carried out/NAME.xz (a call's 64 MiB hold bundle parts too),
# where out/NAME is absent or older than its .xz.
unxz_bins() {
	local b
	for b in "$@"; do
		[ -f "out/$b.xz" ] || continue
		[ -x "out/$b" ] && [ "out/$b" -nt "out/$b.xz" ] && continue
		python3 -c "import lzma,shutil,sys; shutil.copyfileobj(lzma.open(sys.argv[1]), open(sys.argv[2],'wb'))" "out/$b.xz" "out/$b" &&
			chmod +x "out/$b" || { say "out/$b.xz: cannot unpack"; return 1; }
	done
}

# stop_groups PID...: TERM each process group (setsid leaders; a plain process too), wait up to
# STOP_TENTHS tenths of a second (default 200) for all to end, then KILL what is left.
stop_groups() {
	local p alive
	for p in "$@"; do kill -- -"$p" 2>/dev/null || kill "$p" 2>/dev/null; done
	for _ in $(seq "${STOP_TENTHS:-200}"); do
		alive=0
		for p in "$@"; do { kill -0 -- -"$p" 2>/dev/null || kill -0 "$p" 2>/dev/null; } && alive=1; done
		[ $alive = 0 ] && return 0
		sleep 0.1
	done
	for p in "$@"; do kill -9 -- -"$p" 2>/dev/null; kill -9 "$p" 2>/dev/null; done
	return 0
}

# wait_gpu_free [PID...]: until no process but the PIDs holds the GPU (an engine's children can
# outlive its leader; an OrbitKV peer is a CUDA process that outlives the engine), GPU_FREE_TRIES
# looks 0.2 s apart (default 50: 10 s) at most.
wait_gpu_free() {
	command -v nvidia-smi >/dev/null || return 0
	local keep=" $* " p held
	for _ in $(seq "${GPU_FREE_TRIES:-50}"); do
		held=""
		for p in $(nvidia-smi --query-compute-apps=pid --format=csv,noheader); do
			case $keep in *" $p "*) ;; *) held="$held $p" ;; esac
		done
		[ -z "$held" ] && return 0
		sleep 0.2
	done
	say "GPU still held by${held} after ${GPU_FREE_TRIES:-50} looks: $(nvidia-smi --query-compute-apps=pid,process_name --format=csv,noheader | paste -sd' ')"
	return 1
}

# wait_socket PATH PID TENTHS: 0 once PATH is a socket; 1 if PID ends first or TENTHS pass.
wait_socket() {
	for _ in $(seq "$3"); do
		[ -S "$1" ] && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.1
	done
	return 1
}

# wait_http URL PID FIFTHS: 0 once URL answers 2xx; 1 if PID ends first or FIFTHS fifths of a second pass.
wait_http() {
	for _ in $(seq "$3"); do
		curl -sf -o /dev/null --max-time 2 "$1" && return 0
		kill -0 "$2" 2>/dev/null || return 1
		sleep 0.2
	done
	return 1
}

# carry_part NAME NN DIR: move .gpucarry/NAME.partNN (laid anew in the repository at every call)
# to DIR, where it outlives the call while the machine stays warm, with NAME.sha256 beside it.
carry_part() {
	local name=$1 nn=$2 dir=$3
	mkdir -p "$dir" && mv ".gpucarry/$name.part$nn" "$dir/" && cp ".gpucarry/$name.sha256" "$dir/" ||
		{ say "$name part $nn not carried"; return 1; }
	say "carried $name part $nn: $(ls "$dir" | grep -c "^$name\.part[0-9][0-9]$") part(s) under $dir"
}

# unpack_bundle NAME DIR DEST: join DIR/NAME.partNN into NAME.tar.xz, check it against
# NAME.sha256, unpack it into DEST. DEST appears only whole (unpacked beside it, then renamed);
# on a failed check the parts are gone and must be carried again.
unpack_bundle() {
	local name=$1 dir=$2 dest=$3 rc
	[ -d "$dest" ] && { say "$name already unpacked"; return 0; }
	cat "$dir/$name".part[0-9][0-9] >"$dir/$name.tar.xz" && rm -f "$dir/$name".part[0-9][0-9]
	(cd "$dir" && sha256sum -c "$name.sha256") >"$dir/$name.sha.out" 2>&1
	rc=$?
	tee -a "$S" <"$dir/$name.sha.out"
	[ $rc -eq 0 ] || { say "$name: bundle checksum FAILED: carry the parts again"; rm -f "$dir/$name.tar.xz"; return 1; }
	rm -rf "$dest.tmp" && mkdir -p "$dest.tmp" &&
		timeout 600 python3 -c "import tarfile,sys; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter='fully_trusted')" "$dir/$name.tar.xz" "$dest.tmp" ||
		{ say "$name: unpack FAILED"; rm -rf "$dest.tmp"; return 1; }
	mv "$dest.tmp" "$dest" && rm -f "$dir/$name.tar.xz"
	say "$name unpacked: $(du -sm "$dest" | cut -f1) MiB"
}

# pyspy_install: py-spy from a carried wheel (.gpucarry/pyspy/py_spy-*.whl; the GPU machine has no
# network) into $K/pyspy/py-spy, kept while the machine stays warm; 1 where none was ever carried.
pyspy_install() {
	[ -x "$K/pyspy/py-spy" ] && return 0
	local whl
	whl=$(ls .gpucarry/pyspy/py_spy-*.whl 2>/dev/null | head -1)
	[ -n "$whl" ] || { say "py-spy: no .gpucarry/pyspy/py_spy-*.whl carried; no profile"; return 1; }
	mkdir -p "$K/pyspy" && python3 -c 'import sys, zipfile
z = zipfile.ZipFile(sys.argv[1])
n = [m for m in z.namelist() if m.endswith("/scripts/py-spy")][0]
open(sys.argv[2], "wb").write(z.read(n))' "$whl" "$K/pyspy/py-spy" && chmod +x "$K/pyspy/py-spy" ||
		{ say "py-spy: cannot unpack $whl"; return 1; }
}

# pyspy_start PID FILE: sample PID and its child processes (every thread while it runs, without
# pausing them) into FILE in py-spy's raw (collapsed) format until pyspy_stop; PYSPY_RATE a second
# (default 200). Sets PYSPY_PID; a no-op without py-spy.
pyspy_start() {
	PYSPY_PID=
	pyspy_install || return 0
	"$K/pyspy/py-spy" record --pid "$1" --subprocesses --threads --nonblocking --rate "${PYSPY_RATE:-200}" \
		--format raw --output "$2" >>"$2.log" 2>&1 &
	PYSPY_PID=$!
}

# pyspy_stop: end the sampler (SIGINT: it writes its file then), within 20 s.
pyspy_stop() {
	[ -n "${PYSPY_PID:-}" ] || return 0
	kill -INT "$PYSPY_PID" 2>/dev/null
	for _ in $(seq 200); do kill -0 "$PYSPY_PID" 2>/dev/null || break; sleep 0.1; done
	kill -9 "$PYSPY_PID" 2>/dev/null
	wait "$PYSPY_PID" 2>/dev/null
	PYSPY_PID=
}

# pyspy_dumps PID FILE N SECONDS: in the background, N stack dumps of PID and its children (every
# thread, waiting ones too), SECONDS apart, appended to FILE with a timestamp each: what a stalled
# engine waits on. A no-op without py-spy.
pyspy_dumps() {
	pyspy_install || return 0
	local pid=$1 file=$2 n=$3 gap=$4
	(for _ in $(seq "$n"); do
		echo "=== $(date +%T.%N | cut -c1-12)"
		timeout 10 "$K/pyspy/py-spy" dump --pid "$pid" --subprocesses --nonblocking 2>&1
		sleep "$gap"
	done >>"$file") &
}
