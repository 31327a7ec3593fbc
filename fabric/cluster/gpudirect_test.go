package cluster

import (
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
)

// TestRegisterDeviceWithoutEngine: a peer with no RDMA engine registers no
// engine HBM, says why (rdma.ErrNoDevice), and never asks for the dmabuf.
func TestRegisterDeviceWithoutEngine(t *testing.T) {
	c := &Cluster{rd: newRDMASide(ibv.Config{}, prometheus.NewRegistry(), zerolog.Nop())}
	r := &transfer.Region{Name: "cuda0/buffer0", Kind: transfer.Device, Device: 1 << 30, Size: 2 << 20}
	exported := false
	release, err := c.RegisterDevice(r, func(ptr, size uint64) (int, error) { exported = true; return -1, nil })
	if !errors.Is(err, ibv.ErrNoDevice) || release != nil || exported {
		t.Fatalf("RegisterDevice = %v (release set %v, exported %v); want rdma.ErrNoDevice, nothing exported", err, release != nil, exported)
	}
	if _, ok := c.rd.regs.Lookup(r); ok {
		t.Fatal("the region was recorded with the transport")
	}
}
