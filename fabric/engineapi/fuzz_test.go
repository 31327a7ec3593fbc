package engineapi

import (
	"math/big"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/transfer"
)

// FuzzOpenSession feeds arbitrary OpenSession requests to the validator: it
// must return a spec or an error, never panic, and an accepted geometry must
// fit its declared buffers.
func FuzzOpenSession(f *testing.F) {
	for _, mut := range []func(r *pb.OpenSessionRequest){
		func(r *pb.OpenSessionRequest) {},
		func(r *pb.OpenSessionRequest) { r.Segments[1].BlockStride = (1<<64 + 47) / 63 }, // wraps to a small end
		func(r *pb.OpenSessionRequest) { // a page of 2^64 bytes, 0 modulo 2^64
			r.NumBlocks, r.Buffers[0].SizeBytes = 1, 1<<62
			for i, sg := range r.Segments {
				sg.Offset, sg.BlockStride, sg.BlockBytes = uint64(i)<<60, 1<<60, 1<<60
			}
		},
		func(r *pb.OpenSessionRequest) { r.KeepaliveMs = 49 * 24 * 3600 * 1000 },
	} {
		r := tinyFlash.OpenRequest("m", "/dev/shm/kv")
		mut(r)
		b, _ := proto.Marshal(r)
		f.Add(b)
	}
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r pb.OpenSessionRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		spec, err := sessionFromPB(&r, time.Second)
		if err != nil {
			return
		}
		if spec.keepalive > maxKeepalive {
			t.Fatalf("accepted a keepalive of %v", spec.keepalive)
		}
		if len(spec.shm) == 0 {
			return
		}
		sizes := make([]uint64, len(spec.shm))
		for i, s := range spec.shm {
			sizes[i] = s.size
		}
		checkFits(t, spec.geom, sizes)
	})
}

// checkFits fails unless every block of every segment lies inside its
// buffer and the page size is exact, by arithmetic that cannot wrap.
func checkFits(t *testing.T, g transfer.Geometry, sizes []uint64) {
	page := new(big.Int)
	for i, s := range g.Segments {
		end := new(big.Int).Mul(big.NewInt(int64(g.NumBlocks)-1), new(big.Int).SetUint64(s.Stride))
		end.Add(end, new(big.Int).SetUint64(s.Offset)).Add(end, new(big.Int).SetUint64(s.BlockBytes))
		if end.Cmp(new(big.Int).SetUint64(sizes[s.Buffer])) > 0 {
			t.Fatalf("accepted segment %d ending at byte %v of a %d-byte buffer", i, end, sizes[s.Buffer])
		}
		page.Add(page, new(big.Int).SetUint64(s.BlockBytes))
	}
	page.Mul(page, big.NewInt(int64(g.BlocksPerPage)))
	if page.Cmp(new(big.Int).SetUint64(g.PageBytes())) != 0 {
		t.Fatalf("page size %d, exactly %v", g.PageBytes(), page)
	}
}

// FuzzPages feeds arbitrary Save page lists to the validator.
func FuzzPages(f *testing.F) {
	sess := &session{}
	sess.Geom, sess.Bufs = mustSpec(f).geom, []*transfer.Region{nil}
	good, _ := proto.Marshal(&pb.SaveRequest{Pages: []*pb.PageRef{{Key: make([]byte, 16), Blocks: []uint32{0, 1, 2, 3}}}})
	f.Add(good)
	odd, _ := proto.Marshal(&pb.SaveRequest{Pages: []*pb.PageRef{{Key: make([]byte, 16), Blocks: []uint32{0, 1, 2, 3}}}, Durability: 7})
	f.Add(odd)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r pb.SaveRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		if _, err := durabilityFromPB(r.Durability); err == nil && pb.Durability_name[int32(r.Durability)] == "" {
			t.Fatalf("accepted unknown durability %d", r.Durability)
		}
		pages, err := pagesFromPB(r.Pages, sess, 64, false)
		if err == nil {
			for _, p := range pages {
				if err := sess.Geom.CheckBlocks(p.Blocks); err != nil || transfer.HasSkip(p.Blocks) {
					t.Fatalf("save accepted bad blocks %v: %v", p.Blocks, err)
				}
			}
		}
		pages, err = pagesFromPB(r.Pages, sess, 64, true)
		if err != nil {
			return
		}
		for _, p := range pages {
			if err := sess.Geom.CheckBlocks(p.Blocks); err != nil {
				t.Fatalf("load accepted bad blocks: %v", err)
			}
		}
	})
}

func mustSpec(f *testing.F) sessionSpec {
	spec, err := sessionFromPB(tinyFlash.OpenRequest("m", "/dev/shm/kv"), time.Second)
	if err != nil {
		f.Fatal(err)
	}
	return spec
}
