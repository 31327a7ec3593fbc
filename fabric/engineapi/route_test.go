package engineapi

import (
	"testing"

	"google.golang.org/protobuf/proto"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// FuzzRouteKeys feeds arbitrary Route requests to their validator: it must
// return keys or an error, never panic, and never more keys than the limit.
func FuzzRouteKeys(f *testing.F) {
	layout := &pb.Layout{Model: "m", Dtype: "bf16", NumLayers: 2, KvHeads: 2, HeadDim: 16, TpSize: 1, PageTokens: 4, ByteLayout: "ref-paged"}
	for _, r := range []*pb.RouteRequest{
		{Keys: [][]byte{make([]byte, 16), make([]byte, 16)}},
		{Layout: layout, Tokens: []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9}},
		{Layout: layout, Keys: [][]byte{make([]byte, 16)}},
		{Keys: [][]byte{{1, 2}}},
	} {
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	const limit = 8
	f.Fuzz(func(t *testing.T, b []byte) {
		var r pb.RouteRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		keys, err := routeKeys(&r, limit)
		if err == nil && len(keys) > limit {
			t.Fatalf("%d keys accepted, limit %d", len(keys), limit)
		}
	})
}
