package fabric

import (
	"bytes"
	"slices"
	"testing"
	"time"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// BenchmarkAnnounceVisibility measures how long a page saved on one peer
// takes to appear in another peer's lookup (DESIGN.md §6 "catalog": p99 ≤
// 200 ms), two peers on loopback with encrypted gossip. Each iteration saves
// one fresh page and polls the other peer's lookup every 0.5 ms.
//
//	go test -ldflags=-checklinkname=0 -run XXX -bench AnnounceVisibility -benchtime 200x ./fabric
func BenchmarkAnnounceVisibility(b *testing.B) {
	creds := writeCreds(b, b.TempDir(), bytes.Repeat([]byte{3}, 32))
	a := startPeer(b, clusterConfig(b, creds, ""))
	c := startPeer(b, clusterConfig(b, creds, a.gossipAddr()))
	for a.members() != 2 || c.members() != 2 {
		time.Sleep(10 * time.Millisecond)
	}
	ea, ec := a.engine(tinyFlash), c.engine(tinyFlash)
	lat := make([]time.Duration, 0, b.N)
	b.ResetTimer()
	for range b.N {
		keys := randKeys(1)
		okOp(b)(ea.Save(ctx(b), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
		start := time.Now()
		for {
			look, err := ec.Lookup(ctx(b), keys, false)
			if err == nil && look.HitPages == 1 {
				break
			}
			if time.Since(start) > 10*time.Second {
				b.Fatal("page not visible after 10s")
			}
			time.Sleep(500 * time.Microsecond)
		}
		lat = append(lat, time.Since(start))
	}
	b.StopTimer()
	slices.Sort(lat)
	q := func(f float64) float64 { return float64(lat[int(f*float64(len(lat)-1))].Microseconds()) / 1e3 }
	b.ReportMetric(q(0.5), "p50-ms")
	b.ReportMetric(q(0.99), "p99-ms")
	b.ReportMetric(q(1), "max-ms")
}
