//go:build amd64

package crc32c

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"strings"
	"testing"
)

// kernelsHere are the vector kernels this CPU runs; the others are
// skipped with the reason printed, or fail where ORBITKV_REQUIRE names
// them (ORBITKV_REQUIRE=avx512 on the GPU machine).
func kernelsHere(t *testing.T) []vector {
	var out []vector
	for _, v := range []vector{avx512, avx2} {
		if has(v) {
			out = append(out, v)
			continue
		}
		why := fmt.Sprintf("crc32c: this CPU lacks the %s kernel's instructions", v.name)
		if strings.Contains(os.Getenv("ORBITKV_REQUIRE"), v.name) {
			t.Errorf("ORBITKV_REQUIRE=%s but: %s", v.name, why)
			continue
		}
		t.Log(why + " (skipped)")
	}
	return out
}

// Each kernel gives hash/crc32's CRC-32C over whole windows, from any
// state, at any alignment, and a changed bit anywhere changes it.
func TestKernelsMatchHashCRC32(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	buf := randomBytes(r, 64<<10+64)
	for _, v := range kernelsHere(t) {
		w := v.s.windowBytes()
		for _, windows := range []int{1, 2, 3, 5, 64, 255} {
			for _, off := range []int{0, 1, 8, 17, 63} {
				p := buf[off : off+windows*w]
				for _, crc := range []uint32{0, 0xFFFFFFFF, r.Uint32()} {
					want := ^crc32.Update(^crc, table, p)
					if got := v.run(crc, &p[0], len(p), &v.keys[0]); got != want {
						t.Fatalf("%s: %d windows at offset %d, state %08x: %08x, hash/crc32 %08x", v.name, windows, off, crc, got, want)
					}
				}
			}
		}
		if v.hybrid != nil {
			for _, blocks := range []int{1, 2, 7} {
				for _, off := range []int{0, 3, 40} {
					p := buf[off : off+blocks*hybridBlock]
					for _, crc := range []uint32{0, 0xFFFFFFFF, r.Uint32()} {
						want := ^crc32.Update(^crc, table, p)
						if got := v.hybrid(crc, &p[0], len(p), &v.hybridKeys[0]); got != want {
							t.Fatalf("%s hybrid: %d blocks at offset %d, state %08x: %08x, hash/crc32 %08x", v.name, blocks, off, crc, got, want)
						}
					}
				}
			}
		}
		p := buf[:8*w]
		sum := v.run(0, &p[0], len(p), &v.keys[0])
		for _, bit := range []int{0, 7, 8*len(p)/2 + 3, 8*len(p) - 1} {
			p[bit/8] ^= 1 << (bit % 8)
			if v.run(0, &p[0], len(p), &v.keys[0]) == sum {
				t.Fatalf("%s: bit %d flipped, same CRC", v.name, bit)
			}
			p[bit/8] ^= 1 << (bit % 8)
		}
	}
}

// Update with each kernel agrees with hash/crc32 on every length around
// the folding threshold and window edges, and piece by piece.
func TestUpdateMatchesHashCRC32(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	buf := randomBytes(r, 300<<10)
	saved := kernel
	defer func() { kernel = saved }()
	for _, v := range append(kernelsHere(t), sse42) {
		kernel = v
		for n := 0; n < 3*hybridBlock; n += 1 + n/7 {
			if got, want := Checksum(buf[3:3+n]), crc32.Checksum(buf[3:3+n], table); got != want {
				t.Fatalf("%s: %d bytes: %08x, hash/crc32 %08x", v.name, n, got, want)
			}
		}
		want := crc32.Checksum(buf, table)
		var crc uint32
		for p := buf; len(p) > 0; {
			k := min(len(p), 1+r.IntN(70<<10))
			crc, p = Update(crc, p[:k]), p[k:]
		}
		if crc != want {
			t.Fatalf("%s: piece by piece %08x, hash/crc32 %08x", v.name, crc, want)
		}
	}
}

func TestPickHonoursTheEnvironment(t *testing.T) {
	if got := pick("sse4.2"); got.name != "sse4.2" {
		t.Fatalf("pick(sse4.2) = %s", got.name)
	}
	if has(avx2) {
		if got := pick("avx2"); got.name != "avx2" {
			t.Fatalf("pick(avx2) = %s", got.name)
		}
	}
	if got, widest := pick(""), pick(""); got.name != widest.name || (has(avx512) && got.name != "avx512") {
		t.Fatalf("pick() = %s", got.name)
	}
}

// The kernels beside hash/crc32 on the same buffers (go test -bench
// Checksum): a 256 KiB buffer, one read of the TCP data plane, warm in
// the cache.
func BenchmarkChecksum(b *testing.B) {
	p := randomBytes(rand.New(rand.NewPCG(9, 10)), 256<<10)
	b.Run("hash/crc32", func(b *testing.B) {
		b.SetBytes(int64(len(p)))
		for b.Loop() {
			crc32.Checksum(p, table)
		}
	})
	saved := kernel
	defer func() { kernel = saved }()
	for _, v := range kernelsHere(&testing.T{}) {
		kernel = v
		b.Run(v.name, func(b *testing.B) {
			b.SetBytes(int64(len(p)))
			for b.Loop() {
				Checksum(p)
			}
		})
	}
}
