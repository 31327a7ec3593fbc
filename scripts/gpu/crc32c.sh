#!/bin/bash
# The CRC-32C kernels (internal/crc32c) on the GPU machine's Xeon, which has the AVX-512
# VPCLMULQDQ that the development machine lacks: the tests with ORBITKV_REQUIRE=avx512 (so the
# AVX-512 kernel cannot be skipped), then the kernels beside hash/crc32 on the same 256-KiB buffer.
# Carry out/crc32c.test.xz, built here with:
#   go test -c -o out/crc32c.test ./internal/crc32c && xz -f out/crc32c.test
# Prints "crc32c: avx512 kernel verified" when the tests pass; exits non-zero otherwise.
set -u
O=${OUT:-/tmp/orbitkv-gpu-out}
mkdir -p "$O"
[ -x out/crc32c.test ] || xz -dk out/crc32c.test.xz || { echo "crc32c: no out/crc32c.test"; exit 1; }
{ grep -m1 'model name' /proc/cpuinfo; grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'sse4_2|pclmulqdq|avx2|avx512f|avx512vl|vpclmulqdq' | paste -sd' '; } | sed 's/^/cpu: /'
ORBITKV_REQUIRE=avx512 out/crc32c.test -test.count=1 -test.v 2>&1 | tee "$O/crc32c-test.txt" | grep -E '^(--- |FAIL|ok|PASS)|lacks|REQUIRE'
rc=${PIPESTATUS[0]}
out/crc32c.test -test.run XX -test.bench Checksum -test.benchtime 3000x -test.count 3 2>&1 | tee "$O/crc32c-bench.txt" | grep Benchmark
[ "$rc" = 0 ] && echo "crc32c: avx512 kernel verified" || echo "crc32c: tests failed (rc $rc)"
exit "$rc"
