package crc32c

// The hybrid kernel (AVX2 machines): a CPU whose carry-less multiplier
// folds about as fast as its CRC32 instruction sums (the development
// machine's AMD: 25 and 23 GB/s) runs both at once. Each block of
// hybridBlock bytes is four streams of hybridStream bytes, summed by
// CRC32Q from state 0 one quadword a stream in turn, then the folded
// region of the ymm shape's windows. A stream's CRC c is what XORing c
// into the four bytes after the stream does to the buffer's CRC once the
// stream's own bytes count as zero; so each c, as a block standing there,
// is folded onto the first register's first lane at the block's end. The
// fold runs on over the next block's streams (zero to it): its first
// window's fold is by the jump key, the streams' length plus a window.

const (
	hybridStreams = 4
	hybridIters   = 32                                        // loop passes a block: a window folded, 32 bytes of each stream
	hybridStream  = 32 * hybridIters                          // 1 KiB
	hybridFolded  = 128 * hybridIters                         // 4 KiB of ymm windows
	hybridBlock   = hybridStreams*hybridStream + hybridFolded // 8 KiB
)

// hybridKeys are ymm's keys (window, register, two lanes), then the jump
// key, then one key a stream moving its CRC to the block's last window.
func hybridKeys() []foldKey {
	k := ymm.keys()
	w := ymm.windowBytes()
	k = append(k, keyFor(8*(w+hybridStreams*hybridStream)))
	for i := range hybridStreams {
		k = append(k, keyFor(8*(hybridBlock-w-hybridStream*(i+1))))
	}
	return k
}

// hybridModel is the raw CRC of p (whole blocks) from state crc by the
// hybrid kernel's steps, in Go.
func hybridModel(crc uint32, p []byte) uint32 {
	s, k := ymm, hybridKeys()
	const jump, merge = 4, 5
	acc := make([]block, s.lanes*s.regs) // zero: the first fold makes it the first window
	for o := 0; o < len(p); o += hybridBlock {
		var c [hybridStreams]uint32
		if o == 0 {
			c[0] = crc
		}
		for i := range c {
			for q := 0; q < hybridStream; q += 8 {
				c[i] = crc32q(c[i], le64(p[o+i*hybridStream+q:]))
			}
		}
		for w := 0; w < hybridFolded; w += s.windowBytes() {
			key := k[0]
			if w == 0 {
				key = k[jump]
			}
			at := o + hybridStreams*hybridStream + w
			for i := range acc {
				acc[i] = fold(acc[i], key, load(p[at+16*i:]))
			}
		}
		for i, ci := range c {
			m := clmul(uint64(ci), k[merge+i].lo)
			acc[0].lo ^= m.lo
			acc[0].hi ^= m.hi
		}
	}
	return s.reduce(acc, k)
}
