package transfer

import (
	"bytes"
	"math/rand/v2"
	"testing"
)

func TestCopyLargeMatchesCopy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	src := make([]byte, 1<<20+300)
	for i := range src {
		src[i] = byte(r.Uint32())
	}
	for _, c := range []struct{ dstOff, srcOff, n int }{
		{0, 0, ntMin}, {1, 3, ntMin + 1}, {31, 0, 200 << 10}, {7, 11, 1 << 20}, {0, 0, 100}, {5, 9, ntMin - 1},
	} {
		dst := make([]byte, c.n+64)
		want := bytes.Clone(dst)
		copy(want[c.dstOff:], src[c.srcOff:c.srcOff+c.n])
		copyLarge(dst[c.dstOff:c.dstOff+c.n], src[c.srcOff:c.srcOff+c.n])
		if !bytes.Equal(dst, want) {
			t.Fatalf("copy of %d bytes (dst+%d, src+%d) differs or spills", c.n, c.dstOff, c.srcOff)
		}
	}
}

func BenchmarkCopyLarge128K(b *testing.B) { benchChunks(b, copyLarge) }
func BenchmarkCopy128K(b *testing.B) {
	benchChunks(b, func(d, s []byte) { copy(d, s) })
}

func benchChunks(b *testing.B, f func(d, s []byte)) {
	const n, ch = 256 << 20, 128 << 10
	src, dst := make([]byte, n), make([]byte, n)
	copy(dst, src)
	b.SetBytes(n)
	for i := 0; i < b.N; i++ {
		for o := 0; o < n; o += ch {
			f(dst[o:o+ch], src[o:o+ch])
		}
	}
}
