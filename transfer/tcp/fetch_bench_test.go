package tcp

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkFetch fetches one request's worth of pages over loopback, both
// ends in this process, every page verified: MB/s, and with -benchmem the
// allocations per request (client and server together). Not the matrix of
// `orbitkv bench transfer`, which runs the two ends in two network
// namespaces beside iperf3.
func BenchmarkFetch(b *testing.B) {
	for _, tc := range []struct{ size, pages int }{{256 << 10, 64}, {2 << 20, 8}} {
		b.Run(fmt.Sprintf("%dKiB×%d", tc.size>>10, tc.pages), func(b *testing.B) {
			src := newMemSource()
			wants := make([]Want, tc.pages)
			for i := range wants {
				wants[i] = src.add(uint64(i+1), tc.size)
			}
			_, addr := serve(b, src, nil)
			c := NewClient(nil)
			defer c.Close()
			dst := buffers(wants)
			b.SetBytes(int64(tc.size * tc.pages))
			b.ReportAllocs()
			for b.Loop() {
				for i, r := range c.Fetch(context.Background(), addr, wants, dst) {
					if r.Err != nil {
						b.Fatalf("page %d: %v", i, r.Err)
					}
				}
			}
		})
	}
}
