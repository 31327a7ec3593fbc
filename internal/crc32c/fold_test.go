package crc32c

import (
	"hash/crc32"
	"math/rand/v2"
	"testing"
)

func randomBytes(r *rand.Rand, n int) []byte {
	p := make([]byte, n)
	for i := range p {
		p[i] = byte(r.Uint32())
	}
	return p
}

// The Go model of each kernel's steps gives hash/crc32's CRC-32C: it checks
// the constants and the order of folds of both kernels on any machine,
// including the AVX-512 one where the CPU lacks it.
func TestModelMatchesHashCRC32(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for _, s := range []shape{zmm, ymm} {
		for _, windows := range []int{1, 2, 3, 17} {
			for _, crc := range []uint32{0, 1, 0xFFFFFFFF, r.Uint32()} {
				p := randomBytes(r, windows*s.windowBytes())
				want := ^crc32.Update(^crc, table, p)
				if got := s.model(crc, p); got != want {
					t.Fatalf("%d lanes × %d regs, %d windows, state %08x: model %08x, hash/crc32 %08x", s.lanes, s.regs, windows, crc, got, want)
				}
			}
		}
	}
}

func TestCRC32QIsTheTableStep(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 100 {
		c, v := r.Uint32(), r.Uint64()
		b := make([]byte, 8)
		for i := range b {
			b[i] = byte(v >> (8 * i))
		}
		if got, want := crc32q(c, v), ^crc32.Update(^c, table, b); got != want {
			t.Fatalf("crc32q(%08x, %016x) = %08x, want %08x", c, v, got, want)
		}
	}
}

func TestHybridModelMatchesHashCRC32(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	for _, blocks := range []int{1, 2, 5} {
		for _, crc := range []uint32{0, 0xFFFFFFFF, r.Uint32()} {
			p := randomBytes(r, blocks*hybridBlock)
			if got, want := hybridModel(crc, p), ^crc32.Update(^crc, table, p); got != want {
				t.Fatalf("%d blocks, state %08x: model %08x, hash/crc32 %08x", blocks, crc, got, want)
			}
		}
	}
}
