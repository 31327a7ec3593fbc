package fabric

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orbitkv/orbitkv/transfer"
)

// TestGPUBatchesByMethod: each GPU's batch counts come out per device and
// method, and a peer without CUDA exports no series (not zeros that would
// read as "no copies ran").
func TestGPUBatchesByMethod(t *testing.T) {
	stats := map[int]transfer.CUDAStats{
		0: {Batches: 7, ByMethod: map[string]uint64{"batch": 5, "pitched": 2}},
		1: {Batches: 3, ByMethod: map[string]uint64{"kernel": 3}},
	}
	reg := prometheus.NewPedanticRegistry()
	reg.MustRegister(newGPUBatches(func() map[int]transfer.CUDAStats { return stats }))
	got := gatherBatches(t, reg)
	want := map[string]float64{"0/batch": 5, "0/pitched": 2, "1/kernel": 3}
	if len(got) != len(want) {
		t.Fatalf("series %v, want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
	stats = nil
	if got := gatherBatches(t, reg); len(got) != 0 {
		t.Fatalf("without CUDA: series %v, want none", got)
	}
}

// gatherBatches returns orbitkv_transfer_gpu_batches_total by "device/method".
func gatherBatches(t *testing.T, reg *prometheus.Registry) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != "orbitkv_transfer_gpu_batches_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			l := map[string]string{}
			for _, lp := range m.GetLabel() {
				l[lp.GetName()] = lp.GetValue()
			}
			out[l["device"]+"/"+l["method"]] = m.GetCounter().GetValue()
		}
	}
	return out
}
