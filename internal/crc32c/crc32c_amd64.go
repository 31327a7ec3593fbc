//go:build amd64

package crc32c

import (
	"os"

	"golang.org/x/sys/cpu"
)

// foldZ and foldY return the raw CRC of n bytes at p (a whole number of
// their shape's windows, at least one) from state crc, with the shape's
// keys (crc32c_amd64.s): foldZ on AVX-512 registers, foldY on AVX2 ones.
//
//go:noescape
func foldZ(crc uint32, p *byte, n int, keys *foldKey) uint32

//go:noescape
func foldY(crc uint32, p *byte, n int, keys *foldKey) uint32

// foldH is the hybrid kernel (hybrid.go) over whole blocks.
//
//go:noescape
func foldH(crc uint32, p *byte, n int, keys *foldKey) uint32

// cpuid7ecx is CPUID leaf 7's ECX, whose bit 10 is VPCLMULQDQ (which
// golang.org/x/sys/cpu reports only with AVX-512).
func cpuid7ecx() uint32

// vector is one vector kernel: its shape, code and keys, and where it has
// one the hybrid code for whole blocks (hybrid.go) with its keys.
type vector struct {
	name       string
	s          shape
	run        func(uint32, *byte, int, *foldKey) uint32
	keys       []foldKey
	hybrid     func(uint32, *byte, int, *foldKey) uint32
	hybridKeys []foldKey
}

// minFold is the shortest buffer Update folds: below it the kernel's
// set-up and remainder cost more than the CRC32 instruction saves.
const minFold = 1024

var (
	avx512 = vector{name: "avx512", s: zmm, run: foldZ, keys: zmm.keys()}
	avx2   = vector{name: "avx2", s: ymm, run: foldY, keys: ymm.keys(), hybrid: foldH, hybridKeys: hybridKeys()}
	sse42  = vector{name: "sse4.2"}
)

// kernel is the one Update uses: the widest this CPU runs, or the one
// ORBITKV_CRC32C names ("avx2", "sse4.2": a narrower one, to compare; a
// kernel the CPU lacks is not taken).
var kernel = pick(os.Getenv("ORBITKV_CRC32C"))

func has(v vector) bool {
	if !cpu.X86.HasSSE42 || !cpu.X86.HasPCLMULQDQ {
		return false
	}
	switch v.name {
	case "avx512":
		return cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL && cpu.X86.HasAVX512VPCLMULQDQ
	case "avx2":
		return cpu.X86.HasAVX2 && cpuid7ecx()&(1<<10) != 0
	}
	return false
}

func pick(want string) vector {
	for _, v := range []vector{avx512, avx2} {
		if (want == "" || want == v.name) && has(v) {
			return v
		}
	}
	return sse42
}

// foldable is how many of n bytes the kernel folds: whole windows, none
// below minFold.
func foldable(n int) int {
	if kernel.run == nil || n < minFold {
		return 0
	}
	return n - n%kernel.s.windowBytes()
}

// foldAsm is the raw CRC of p (foldable's length) from state crc: whole
// hybrid blocks first where the kernel has them, then whole windows.
func foldAsm(crc uint32, p []byte) uint32 {
	if v := kernel; v.hybrid != nil && len(p) >= hybridBlock {
		n := len(p) - len(p)%hybridBlock
		crc, p = v.hybrid(crc, &p[0], n, &v.hybridKeys[0]), p[n:]
	}
	if len(p) == 0 {
		return crc
	}
	return kernel.run(crc, &p[0], len(p), &kernel.keys[0])
}
