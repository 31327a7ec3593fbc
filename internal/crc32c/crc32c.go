// Package crc32c is the CRC-32C (Castagnoli) of page bytes, the checksum of
// every page the peer stores, serves and receives (internal/page). It
// returns what hash/crc32 returns with the Castagnoli table, faster on
// large buffers where the CPU multiplies carry-less on vector registers:
// the buffer is folded 64 bytes a register (AVX-512 VPCLMULQDQ) or 32
// (AVX2 with VPCLMULQDQ, the CRC32 instruction summing streams of each
// block beside the fold: hybrid.go) into a 16-byte remainder whose CRC the
// CRC32 instruction takes. hash/crc32 runs Castagnoli on the CRC32
// instruction alone (three streams, about 8 bytes a cycle); it folds only
// IEEE with vectors. Measured beside hash/crc32:
// docs/journal/2026-11-30-tcp-data-plane.md, "A faster CRC-32C".
//
// # Folding
//
// The bits of a buffer, in the reflected order of this CRC (bit 0 of byte
// 0 first, the highest power), form a polynomial M; the raw CRC of M from
// state 0 is M·x³² mod P. A 16-byte block A that stands D bits before
// block B may be replaced by a block congruent to A·x^D mod P, XORed into
// B, without changing M mod P. Loaded little endian, A's low quadword h
// holds its 64 highest powers and its high quadword l the 64 lowest, so
// A·x^D = h·x^(64+D) + l·x^D, and each half times a 32-bit constant
// (x^(64+D−1) and x^(D−1) mod P, reflected) is one carry-less multiply
// whose 96-bit product, read as a block, carries the missing factor x.
// After the last fold one block R stands where the buffer ends, and the
// buffer's raw CRC is R's, two CRC32Q from state 0. The starting state is
// XORed into the first four bytes. fold.go holds the constants and a model
// of the same steps in Go that the tests check against hash/crc32 on every
// machine; crc32c_amd64.s runs them.
package crc32c

import "hash/crc32"

var table = crc32.MakeTable(crc32.Castagnoli)

// Update returns the CRC-32C of the bytes before p (crc) continued over p:
// crc32.Update(crc, crc32.MakeTable(crc32.Castagnoli), p).
func Update(crc uint32, p []byte) uint32 {
	if n := foldable(len(p)); n > 0 {
		crc = ^foldAsm(^crc, p[:n])
		p = p[n:]
	}
	return crc32.Update(crc, table, p)
}

// Checksum returns the CRC-32C of p.
func Checksum(p []byte) uint32 { return Update(0, p) }

// Kernel names the code Update runs on large buffers here: "avx512", "avx2"
// or "sse4.2" (hash/crc32's; also where the others are not built).
func Kernel() string { return kernel.name }
