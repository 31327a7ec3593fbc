package fabric

import (
	"strings"
	"sync/atomic"
	"syscall"
	"testing"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/ssd"
)

// TestSSDWriteFaultIsReported: an SSD write that fails (injected through
// the tier's filesystem seam) fails that page's durable save with
// PAGE_IO_ERROR, is counted, turns the status unhealthy with the reason,
// and the DRAM tier keeps serving.
func TestSSDWriteFaultIsReported(t *testing.T) {
	var armed atomic.Bool
	cfg := smallConfig(t.TempDir())
	cfg.SSDFS = ssd.WithFaults(ssd.OS, func(_ string, op *ssd.Op) error {
		if op.Point == ssd.BeforeWrite && armed.CompareAndSwap(true, false) {
			return syscall.EIO
		}
		return nil
	})
	tp := startPeer(t, cfg)
	e := tp.engine(tinyFlash)
	keys := randKeys(3)
	armed.Store(true)
	st, err := e.Save(ctx(t), refs(keys[:1], 0, 4), pb.Durability_DURABILITY_SSD)
	if err != nil || st.Pages[0].Code != pb.PageCode_PAGE_IO_ERROR {
		t.Fatalf("save on a failing write: %v %v, want PAGE_IO_ERROR", st, err)
	}
	if got := tp.metric(`orbitkv_tiers_ssd_errors_total{op="write"}`); !strings.HasSuffix(got, " 1") {
		t.Errorf("ssd write errors metric: %q, want 1", got)
	}
	status, err := tp.admin.Status(ctx(t), &pb.StatusRequest{})
	if err != nil || status.Healthy || !strings.Contains(status.Problem, "input/output error") {
		t.Fatalf("status after a failed write: %v %v, want unhealthy with the reason", status, err)
	}
	src := refs(keys, 0, 4)
	okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
	loadExpect(t, e, keys, 40, pagesOf(e, src), "dram after the fault")
}
