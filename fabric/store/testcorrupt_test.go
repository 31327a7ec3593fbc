package store

import (
	"bytes"
	"testing"
)

// TestCorruptHookFlipsOneBitOfEveryNthLoad: with the test-only hook every
// second load's first page reaches the engine with bit 6 of its first
// element's last byte flipped (an fp32 exponent bit) and nothing else
// changed; the other loads and pages are byte-exact. Off, nothing changes.
func TestCorruptHookFlipsOneBitOfEveryNthLoad(t *testing.T) {
	ps := testStore(t, 0)
	e := newTestEngine(t)
	keys := randKeys(t, 2)
	src := reqs(keys, 0)
	saveAll(t, "save", ps, e, src)
	want := [][]byte{e.page(src[0].Blocks), e.page(src[1].Blocks)}
	load := func() [][]byte {
		t.Helper()
		dst := reqs(keys, 32)
		res := make([]Result, len(dst))
		ps.Load(testCtx(t), e.Engine, dst, res)
		mustAllOK(t, "load", res)
		return [][]byte{e.page(dst[0].Blocks), e.page(dst[1].Blocks)}
	}
	if got := load(); !bytes.Equal(got[0], want[0]) || !bytes.Equal(got[1], want[1]) {
		t.Fatal("with the hook off a load changed bytes")
	}
	ps.corrupt.every = 2
	for round := 1; round <= 4; round++ {
		got := load()
		if !bytes.Equal(got[1], want[1]) {
			t.Fatalf("round %d: the second page changed", round)
		}
		flips := 0
		for i := range got[0] {
			if d := got[0][i] ^ want[0][i]; d != 0 {
				if i != 3 || d != 0x40 {
					t.Fatalf("round %d: byte %d differs by %#x", round, i, d)
				}
				flips++
			}
		}
		// The flip stays in the DRAM copy: rounds 2 and 4 flip it (back and forth).
		if wantFlips := map[int]int{1: 0, 2: 1, 3: 1, 4: 0}[round]; flips != wantFlips {
			t.Fatalf("round %d: %d flipped bytes, want %d", round, flips, wantFlips)
		}
	}
	if ps.TestCorruptedPages() != 2 {
		t.Fatalf("corrupted pages = %d, want 2", ps.TestCorruptedPages())
	}
}
