package rdma

import (
	"errors"
	"testing"

	ibv "github.com/orbitkv/orbitkv/rdma"
)

func TestDescriptorsMapToOps(t *testing.T) {
	pool := &ibv.Region{Key: 3, Name: "pool"}
	resolve := func(l any) (*ibv.Region, bool) { return pool, l == "pool" }
	ops, errs := toOps([]Desc{
		{RemoteKey: 9, RemoteOff: 4096, Len: 100, Local: "pool", LocalOff: 8192},
		{RemoteKey: 9, Len: 100, Local: "elsewhere"},
		{RemoteKey: 9, Len: 0, Local: "pool"},
	}, resolve)
	if errs[0] != nil || ops[0].Remote != 9 || ops[0].RemoteOff != 4096 || ops[0].Len() != 100 ||
		ops[0].Local[0] != (ibv.Segment{Region: pool, Off: 8192, Len: 100}) {
		t.Fatalf("descriptor 0: %+v, %v", ops[0], errs[0])
	}
	if !errors.Is(errs[1], ErrUnregistered) || errs[2] == nil {
		t.Fatalf("bad descriptors: %v, %v", errs[1], errs[2])
	}
}
