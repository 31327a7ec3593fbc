package crc32c

import "math/bits"

// poly is the Castagnoli polynomial without its x³² term, in the usual
// (not reflected) order: bit m is the coefficient of x^m.
const poly = 0x1EDC6F41

// xPow returns x^m mod P, not reflected.
func xPow(m int) uint32 {
	r := uint32(1)
	for range m {
		carry := r&(1<<31) != 0
		r <<= 1
		if carry {
			r ^= poly
		}
	}
	return r
}

// foldKey is the pair of constants that folds a block D bits forward: lo
// multiplies the block's low quadword, hi its high one (package doc).
type foldKey struct{ lo, hi uint64 }

func keyFor(d int) foldKey {
	return foldKey{
		lo: uint64(bits.Reverse32(xPow(64+d-1))) << 32,
		hi: uint64(bits.Reverse32(xPow(d-1))) << 32,
	}
}

// shape is one vector kernel's layout: lanes 16-byte blocks a register,
// regs registers, so that each pass over a window of lanes·regs·16 bytes
// folds every block one window forward.
type shape struct {
	lanes, regs int
}

func (s shape) regBytes() int    { return 16 * s.lanes }
func (s shape) windowBytes() int { return s.regBytes() * s.regs }

// keys are a shape's constants, in the order its kernel reads them: the
// window fold, the register fold (one register forward), then one pair per
// lane folding it onto the last lane (the last lane's pair zero).
func (s shape) keys() []foldKey {
	k := []foldKey{keyFor(8 * s.windowBytes()), keyFor(8 * s.regBytes())}
	for l := range s.lanes {
		if d := 128 * (s.lanes - 1 - l); d > 0 {
			k = append(k, keyFor(d))
		} else {
			k = append(k, foldKey{})
		}
	}
	return k
}

var (
	zmm = shape{lanes: 4, regs: 4} // AVX-512: 256-byte windows
	ymm = shape{lanes: 2, regs: 4} // AVX2: 128-byte windows
)

// block is 16 bytes as loaded little endian.
type block struct{ lo, hi uint64 }

func load(p []byte) block {
	return block{le64(p), le64(p[8:])}
}

func le64(p []byte) uint64 {
	_ = p[7]
	return uint64(p[0]) | uint64(p[1])<<8 | uint64(p[2])<<16 | uint64(p[3])<<24 |
		uint64(p[4])<<32 | uint64(p[5])<<40 | uint64(p[6])<<48 | uint64(p[7])<<56
}

// clmul is the carry-less product of a and b.
func clmul(a, b uint64) block {
	var r block
	for i := range 64 {
		if b&(1<<i) != 0 {
			r.lo ^= a << i
			if i > 0 {
				r.hi ^= a >> (64 - i)
			}
		}
	}
	return r
}

// fold is one fold of x by k, XORed into y: what VPCLMULQDQ $0x00 and
// $0x11 and an XOR do to each lane.
func fold(x block, k foldKey, y block) block {
	a, b := clmul(x.lo, k.lo), clmul(x.hi, k.hi)
	return block{a.lo ^ b.lo ^ y.lo, a.hi ^ b.hi ^ y.hi}
}

// model is the raw CRC of p (a whole number of s's windows, at least one)
// from state crc, by the steps the kernel of shape s takes, in Go.
func (s shape) model(crc uint32, p []byte) uint32 {
	k := s.keys()
	acc := make([]block, s.lanes*s.regs) // register r lane l at r*lanes+l
	for i := range acc {
		acc[i] = load(p[16*i:])
	}
	acc[0].lo ^= uint64(crc)
	for w := s.windowBytes(); w < len(p); w += s.windowBytes() {
		for i := range acc {
			acc[i] = fold(acc[i], k[0], load(p[w+16*i:]))
		}
	}
	return s.reduce(acc, k)
}

// reduce folds the registers' blocks (acc, register r lane l at
// r*lanes+l) onto the last register's last lane and returns that block's
// raw CRC.
func (s shape) reduce(acc []block, k []foldKey) uint32 {
	last := acc[:s.lanes]
	for r := 1; r < s.regs; r++ {
		next := acc[r*s.lanes : (r+1)*s.lanes]
		for l := range next {
			next[l] = fold(last[l], k[1], next[l])
		}
		last = next
	}
	r := last[s.lanes-1]
	for l := 0; l < s.lanes-1; l++ {
		r = fold(last[l], k[2+l], r)
	}
	return crc32q(crc32q(0, r.lo), r.hi)
}

// crc32q is the CRC32 instruction on a quadword: the raw CRC of its eight
// bytes, little endian, continued from c.
func crc32q(c uint32, v uint64) uint32 {
	const rpoly = 0x82F63B78 // poly reflected
	c64 := uint64(c) ^ v
	for range 64 {
		if c64&1 != 0 {
			c64 = c64>>1 ^ rpoly
		} else {
			c64 >>= 1
		}
	}
	return uint32(c64)
}
