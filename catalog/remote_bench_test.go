package catalog

import (
	"fmt"
	"runtime"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

// BenchmarkRemoteBytesPerEntry measures the remote index's heap per page
// (a page held by holders members), beside the index as it was before
// origins passed 128: the same sharded maps of pages whose holders were a
// fixed 128-bit set. The baseline is measured in the same run and only
// where its ids fit (origins below 128).
//
//	go test -ldflags=-checklinkname=0 ./catalog -run '^$' -bench RemoteBytesPerEntry -benchtime 1x
func BenchmarkRemoteBytesPerEntry(b *testing.B) {
	const pages = 200_000
	for _, tc := range []struct {
		members, holders int
	}{{10, 1}, {10, 3}, {60, 4}, {60, 5}, {120, 8}, {120, 60}, {1000, 1}, {1000, 3}, {1000, 8}, {1000, 100}} {
		b.Run(fmt.Sprintf("members=%d/holders=%d", tc.members, tc.holders), func(b *testing.B) {
			var got, base float64
			for b.Loop() {
				got = heapPerPage(pages, func() any { return fillRemote(pages, tc.members, tc.holders) })
				if tc.members <= 128 {
					base = heapPerPage(pages, func() any { return fillRemote128(pages, tc.members, tc.holders) })
				}
			}
			b.ReportMetric(got, "B/page")
			if base > 0 {
				b.ReportMetric(base, "base-B/page")
				b.ReportMetric(got/base, "ratio")
			}
		})
	}
}

// heapPerPage is the heap fill keeps alive, per page.
func heapPerPage(pages int, fill func() any) float64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	x := fill()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(x)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(pages)
}

// holdersOf returns page i's holders among members: holders consecutive
// ids from one that depends on i.
func holdersOf(i, members, holders int) []int {
	out := make([]int, holders)
	for j := range out {
		out[j] = (i*7919 + j) % members
	}
	return out
}

func benchKey(i int) pagekey.Key {
	var k pagekey.Key
	for j := range 8 {
		k[j] = byte(uint64(i) * 0x9e3779b97f4a7c15 >> (8 * j))
	}
	return k
}

func fillRemote(pages, members, holders int) *Remote {
	r := NewRemote()
	for i := range pages {
		for _, o := range holdersOf(i, members, holders) {
			if err := r.Add(o, benchKey(i), pagekey.Fingerprint{1}, 4096); err != nil {
				panic(err)
			}
		}
	}
	return r
}

// remote128 is the index before origins passed 128 (its storage only).
type remote128 [remoteShards]map[pagekey.Key]struct {
	layout  pagekey.Fingerprint
	size    uint64
	holders [2]uint64
}

func fillRemote128(pages, members, holders int) *remote128 {
	var r remote128
	for i := range r {
		r[i] = map[pagekey.Key]struct {
			layout  pagekey.Fingerprint
			size    uint64
			holders [2]uint64
		}{}
	}
	for i := range pages {
		k := benchKey(i)
		m := r[int(k[0])%remoteShards]
		p := m[k]
		p.layout, p.size = pagekey.Fingerprint{1}, 4096
		for _, o := range holdersOf(i, members, holders) {
			p.holders[o>>6] |= 1 << (o & 63)
		}
		m[k] = p
	}
	return &r
}
