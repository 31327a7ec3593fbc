#!/bin/bash
# The TCP transfer matrix (orbitkv bench transfer --netns --split-cpus) on the GPU machine's
# 16 cores: each namespace gets 8, so each connection's check can run on a core of its own
# (docs/journal/2026-11-30-tcp-data-plane.md "Each namespace on its own cores"). Carry out/orbitkv.xz and out/netbin
# (Debian 12's iperf3 and ip with their libraries, for machines that lack them):
#   mkdir -p out/netbin/lib && cp /usr/bin/iperf3 /usr/sbin/ip out/netbin/ &&
#   for l in libiperf.so.0 libsctp.so.1 libbpf.so.1 libelf.so.1 libmnl.so.0 libbsd.so.0 libcap.so.2 libmd.so.0; do
#     cp -L /lib/x86_64-linux-gnu/$l out/netbin/lib/; done
# The machine's own iperf3 and ip are used where they exist. PROFILE=1 writes both sides' Go CPU
# profiles to $OUT/transfer.{serve,client}.pprof (read them here with go tool pprof). VERIFY
# (default: the client's own choice) is bench transfer's --verify: where the client checksums each page. POOL
# (default 64MiB) is --pool-bytes, the pages the serve side holds per size (4 to 4,096 pages): 16MiB
# is one request's worth, the same pages sent every time, warm in its caches; 1GiB (4,096 pages of
# 256 KiB, 512 of 2 MiB) sends pages that are cold. The client's destination is one request a
# connection whatever POOL is (BATCH below). BATCH (default 16MiB) is --batch-bytes, one request's
# pages, which is also each connection's destination: 1MiB keeps it in the client's cache.
# PREFETCH (--serve-prefetch, bytes; default: the server's own, 2 MiB with 4 or more cores) is how far
# the serve side reads each answer's pages ahead of its writes; 0 turns it off.
# RPS=1 (--rps) processes each veth's received packets on its own namespace's CPUs, as two hosts
# would, for the fetch and iperf3 alike. SPLICE=1 (--serve-splice) has the serve side write page bytes by
# reference (tcp.Server.Splice). STREAMS=1 (--streams) adds plain TCP streams to every cell, read into
# the fetch's destination and into one buffer: what the link moves into that memory with no protocol.
# GOMAXPROCS, if set, reaches both sides (they inherit it; the header line prints the client's).
# Every cell also prints each side's cores and core-seconds per GB beside iperf3's ("cpu" lines).
set -u
. "$(dirname "$0")/lib.sh"
O=${OUT:-/tmp/orbitkv-gpu-out}
mkdir -p "$O"
S=$O/summary.txt
unxz_bins orbitkv && [ -x out/orbitkv ] || { say "no out/orbitkv"; exit 1; }
B=$(mktemp -d /tmp/okv-netbin.XXXX)
for t in iperf3 ip; do command -v "$t" >/dev/null || { cp out/netbin/"$t" "$B/"; say "$t: carried (Debian 12)"; }; done
export PATH=$PATH:$B LD_LIBRARY_PATH=${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$(pwd)/out/netbin/lib
say "cpus $(nproc): $(iperf3 --version | head -1); $(ip -V)"
command -v lscpu >/dev/null && lscpu -e=CPU,CORE,SOCKET,NODE 2>/dev/null | tr -s ' ' | paste -sd';' | sed 's/^/cpu topology: /' | tee -a "$S"
# the CPU model and the vector instructions a faster CRC-32C would use (VPCLMULQDQ on 512-bit registers)
{ grep -m1 'model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'sse4_2|pclmulqdq|avx2|avx512f|avx512vl|vpclmulqdq' | paste -sd' '; } | sed 's/^/cpu: /' | tee -a "$S"
ip netns add okv-probe && ip netns del okv-probe || { say "cannot make a network namespace here"; exit 1; }
out/orbitkv bench transfer --netns --split-cpus --sizes ${SIZES:-256KiB,2MiB} --conns ${CONNS:-1,2,4} \
	--seconds 1 --rounds ${ROUNDS:-3} --transports tcp --ops read --verify ${VERIFY:-default} --pool-bytes ${POOL:-64MiB} --batch-bytes ${BATCH:-16MiB} \
	${PREFETCH:+--serve-prefetch $PREFETCH} $([ "${RPS:-0}" = 1 ] && echo --rps) $([ "${SPLICE:-0}" = 1 ] && echo --serve-splice) $([ "${STREAMS:-0}" = 1 ] && echo --streams) ${PROFILE:+--cpuprofile "$O/transfer"} 2>&1 | tee -a "$S"
say "bench transfer rc=${PIPESTATUS[0]}"
