package fabric

import (
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
	good, _ := proto.Marshal(tinyFlash.OpenRequest("m", "/dev/shm/kv"))
	f.Add(good)
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, b []byte) {
		var r pb.OpenSessionRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		spec, err := sessionFromPB(&r, time.Second)
		if err != nil || len(spec.shm) == 0 {
			return
		}
		sizes := make([]uint64, len(spec.shm))
		for i, s := range spec.shm {
			sizes[i] = s.size
		}
		if err := spec.geom.Validate(sizes); err != nil {
			t.Fatalf("accepted a geometry that does not fit: %v", err)
		}
	})
}

// FuzzPages feeds arbitrary Save page lists to the validator.
func FuzzPages(f *testing.F) {
	sess := &session{geom: mustSpec(f).geom, bufs: []*transfer.Region{nil}}
	good, _ := proto.Marshal(&pb.SaveRequest{Pages: []*pb.PageRef{{Key: make([]byte, 16), Blocks: []uint32{0, 1, 2, 3}}}})
	f.Add(good)
	f.Fuzz(func(t *testing.T, b []byte) {
		var r pb.SaveRequest
		if proto.Unmarshal(b, &r) != nil {
			return
		}
		pages, err := pagesFromPB(r.Pages, sess, 64, false)
		if err == nil {
			for _, p := range pages {
				if err := sess.geom.CheckBlocks(p.Blocks); err != nil || transfer.HasSkip(p.Blocks) {
					t.Fatalf("save accepted bad blocks %v: %v", p.Blocks, err)
				}
			}
		}
		pages, err = pagesFromPB(r.Pages, sess, 64, true)
		if err != nil {
			return
		}
		for _, p := range pages {
			if err := sess.geom.CheckBlocks(p.Blocks); err != nil {
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
