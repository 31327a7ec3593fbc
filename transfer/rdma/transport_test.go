package rdma

import (
	"context"
	"errors"
	"testing"

	"github.com/orbitkv/orbitkv/internal/page"
	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
)

type mapLocator map[uint64]Placement // by RemoteOff, for the test

func (m mapLocator) Locate(_ context.Context, _ string, d transfer.RemoteDesc) (Placement, error) {
	p, ok := m[d.RemoteOff]
	if !ok {
		return p, transfer.ErrRemoteNotFound
	}
	return p, nil
}

// TestDescriptorsMapToOps: doc.go's mapping, descriptor by descriptor, and
// the descriptors that cannot be mapped fail alone with their reason. Pure
// (no Conn: mapDesc only).
func TestDescriptorsMapToOps(t *testing.T) {
	pool := transfer.HostRegion("pool", make([]byte, 16384))
	other := transfer.HostRegion("other", make([]byte, 16384))
	reg := &ibv.Region{Key: 3, Name: "pool"}
	var g Registry
	g.Add(pool, reg)
	hd := page.Header{Length: 100, Checksum: 7}
	tr := &Transport{Regions: &g, Locate: mapLocator{4096: {Region: 9, Off: 8192, Header: hd}}}
	for _, tc := range []struct {
		name   string
		d      transfer.RemoteDesc
		want   ibv.Op
		header page.Header
		err    error // nil: mapped
	}{
		{"read is placed by the locator", transfer.RemoteDesc{Op: transfer.Read, RemoteOff: 4096, Len: 100, Local: pool, LocalOff: 200},
			ibv.Op{Remote: 9, RemoteOff: 8192, Local: []ibv.Segment{{Region: reg, Off: 200, Len: 100}}}, hd, nil},
		{"write by address", transfer.RemoteDesc{Op: transfer.Write, Remote: transfer.RemoteKey{RKey: 5}, RemoteOff: 64, Len: 10, Local: pool},
			ibv.Op{Remote: 5, RemoteOff: 64, Local: []ibv.Segment{{Region: reg, Off: 0, Len: 10}}}, page.Header{}, nil},
		{"write by content", transfer.RemoteDesc{Op: transfer.Write, Len: 10, Local: pool}, ibv.Op{}, page.Header{}, transfer.ErrUnsupported},
		{"unknown page", transfer.RemoteDesc{Op: transfer.Read, RemoteOff: 1, Len: 10, Local: pool}, ibv.Op{}, page.Header{}, transfer.ErrRemoteNotFound},
		{"unregistered local", transfer.RemoteDesc{Op: transfer.Read, RemoteOff: 4096, Len: 10, Local: other}, ibv.Op{}, page.Header{}, ErrUnregistered},
		{"past the local region", transfer.RemoteDesc{Op: transfer.Read, RemoteOff: 4096, Len: 100, Local: pool, LocalOff: 16300}, ibv.Op{}, page.Header{}, errAny},
		{"empty", transfer.RemoteDesc{Op: transfer.Read, RemoteOff: 4096, Local: pool}, ibv.Op{}, page.Header{}, errAny},
	} {
		t.Run(tc.name, func(t *testing.T) {
			op, h, err := tr.mapDesc(context.Background(), "m", tc.d)
			switch {
			case tc.err == nil && err != nil:
				t.Fatalf("not mapped: %v", err)
			case tc.err == errAny && err == nil, tc.err != nil && tc.err != errAny && !errors.Is(err, tc.err):
				t.Fatalf("error %v, want %v", err, tc.err)
			case tc.err == nil && (op.Remote != tc.want.Remote || op.RemoteOff != tc.want.RemoteOff || len(op.Local) != 1 || op.Local[0] != tc.want.Local[0] || h != tc.header):
				t.Fatalf("op %+v header %+v, want %+v %+v", op, h, tc.want, tc.header)
			}
		})
	}
	_, _, err := (&Transport{Regions: &g}).mapDesc(context.Background(), "m", transfer.RemoteDesc{Op: transfer.Read, Len: 1, Local: pool})
	if !errors.Is(err, transfer.ErrUnsupported) {
		t.Fatalf("read without a locator: %v, want ErrUnsupported", err)
	}
}

var errAny = errors.New("any error")
