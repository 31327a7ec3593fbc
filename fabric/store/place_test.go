package store

import (
	"bytes"
	"testing"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// TestPlaceDRAMPinsWhatIsInDRAM: pages in DRAM are placed at their slot
// (the region's bytes there are the page, its header verifies them), sealed
// first when unsealed, and pinned until release; a page only on SSD, one of
// another layout or size, and one not held are not placed and not pinned.
func TestPlaceDRAMPinsWhatIsInDRAM(t *testing.T) {
	ps := testStore(t, 64<<20)
	e := newTestEngine(t)
	keys := randKeys(t, 3)
	src := reqs(keys, 0)
	saveAll(t, "save", ps, e, src)
	unseal(ps, keys[0])
	if _, err := ps.Evict(testCtx(t), catalog.TierDRAM, keys[2:]); err != nil { // page 2: SSD only
		t.Fatal(err)
	}
	want := func(k pagekey.Key) tcp.Want { return tcp.Want{Key: k, Layout: e.FP, Size: e.PageBytes} }
	otherLayout := want(keys[1])
	otherLayout.Layout[0] ^= 1
	otherSize := want(keys[1])
	otherSize.Size--
	wants := []tcp.Want{want(keys[0]), want(keys[1]), want(keys[2]), otherLayout, otherSize, want(randKey(t))}
	placed, release := ps.PlaceDRAM(wants)
	host := ps.DRAMRegion().Host
	for i, p := range placed {
		inDRAM := i < 2
		if p.OK != inDRAM {
			t.Fatalf("want %d placed %v, want %v", i, p.OK, inDRAM)
		}
		if dram, ssd := ps.Pinned(wants[i].Key); i == 2 && (dram || ssd) {
			t.Fatalf("ssd-only page pinned though not placed (dram %v, ssd %v)", dram, ssd)
		}
		if !inDRAM {
			continue
		}
		b := host[p.Off : p.Off+p.Header.Length]
		if !bytes.Equal(b, e.page(src[i].Blocks)) || p.Header.Verify(b) != nil || p.Header.Key != keys[i] || p.Header.Checksum == 0 {
			t.Fatalf("placement %d: header %+v does not describe the slot's bytes", i, p.Header)
		}
		if dram, _ := ps.Pinned(keys[i]); !dram {
			t.Fatalf("placed page %d not pinned", i)
		}
	}
	release()
	for i, k := range keys {
		if dram, ssd := ps.Pinned(k); dram || ssd {
			t.Fatalf("page %d pinned after release", i)
		}
	}
}
