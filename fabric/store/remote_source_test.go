package store

import (
	"testing"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/transfer/transporttest"
)

// TestFetchedPagesReportRemote: a load whose pages were fetched from a
// member reports them as remote (results and
// orbitkv_fabric_loaded_pages_total{tier="remote"}), though they land in
// this peer's DRAM on the way; the next load of the same pages is a DRAM
// hit. Before, both loads counted as DRAM and the remote series stayed 0.
func TestFetchedPagesReportRemote(t *testing.T) {
	const n = 5
	fx := newRemoteFixture(t, n, transporttest.Faults{})
	remote, dram := fx.s.m.loadedPages.WithLabelValues("remote"), fx.s.m.loadedPages.WithLabelValues("dram")
	for round, want := range []catalog.Tier{catalog.TierRemote, catalog.TierDRAM} {
		_, res := fx.load(testCtx(t))
		mustAllOK(t, "load", res)
		for i, r := range res {
			if r.Tier != want {
				t.Fatalf("load %d, page %d: tier %v, want %v", round, i, r.Tier, want)
			}
		}
	}
	if got := counterValue(t, remote); got != n {
		t.Errorf("loaded pages from remote = %v, want %d", got, n)
	}
	if got := counterValue(t, dram); got != n {
		t.Errorf("loaded pages from dram = %v, want %d (the second load)", got, n)
	}
}
