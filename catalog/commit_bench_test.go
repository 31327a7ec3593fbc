package catalog

import "testing"

// BenchmarkDRAMCopyOfAnSSDPage: what the store's hot path pays to add and
// drop a DRAM copy of a page held on SSD (a readmission's attach, a
// promotion, the eviction of a clean copy), on the disk under TMPDIR. Such a
// change says nothing new in the page's record.
//
//	go test -run '^$' -bench DRAMCopyOfAnSSDPage -benchtime 2000x ./catalog
func BenchmarkDRAMCopyOfAnSSDPage(b *testing.B) {
	c, err := Open(Options{Dir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	e := ssdEntry(1)
	if err := c.Put(e); err != nil {
		b.Fatal(err)
	}
	syncs := c.Stats().Syncs
	b.ResetTimer()
	for i := range b.N {
		slot := int64(-1)
		if i%2 == 0 {
			slot = int64(i % 64)
		}
		if _, _, err := c.Update(e.Key, func(x *Entry) bool { x.DRAMSlot = slot; return true }); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(c.Stats().Syncs-syncs)/float64(b.N), "syncs/op")
}
