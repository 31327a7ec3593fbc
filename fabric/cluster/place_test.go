package cluster

import (
	"bytes"
	"errors"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// fakeTimers stands in for time.AfterFunc: the test fires a lease's expiry
// when it chooses.
type fakeTimers struct {
	fns     []func()
	stopped []bool
	ttls    []time.Duration
}

func (f *fakeTimers) after(d time.Duration, fn func()) func() bool {
	i := len(f.fns)
	f.fns, f.stopped, f.ttls = append(f.fns, fn), append(f.stopped, false), append(f.ttls, d)
	return func() bool { f.stopped[i] = true; return true }
}

func newTestLeases(t *testing.T) (*leaseTable, *fakeTimers) {
	t.Helper()
	ft := &fakeTimers{}
	lt := newLeaseTable(prometheus.NewRegistry())
	lt.after = ft.after
	return lt, ft
}

func TestPlacementLeaseExpiryUnpins(t *testing.T) {
	lt, ft := newTestLeases(t)
	released := 0
	id, err := lt.grant("m", time.Second, func() { released++ })
	if err != nil {
		t.Fatal(err)
	}
	if lt.count() != 1 || released != 0 || ft.ttls[0] != time.Second {
		t.Fatalf("after grant: %d held, %d released, ttl %v", lt.count(), released, ft.ttls[0])
	}
	ft.fns[0]() // the lease's end
	if lt.count() != 0 || released != 1 {
		t.Fatalf("after expiry: %d held, %d released", lt.count(), released)
	}
	if lt.end(id, "m", "released") || released != 1 {
		t.Fatal("an expired lease released again")
	}
	if got := counterValue(t, lt.ended.WithLabelValues("expired")); got != 1 {
		t.Fatalf("expired leases counted %v", got)
	}
}

func TestPlacementLeaseRelease(t *testing.T) {
	for _, tc := range []struct {
		name, by     string
		wantReleased bool
	}{
		{"by its member", "m", true},
		{"by another member", "other", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lt, ft := newTestLeases(t)
			released := 0
			id, err := lt.grant("m", time.Second, func() { released++ })
			if err != nil {
				t.Fatal(err)
			}
			if got := lt.end(id, tc.by, "released"); got != tc.wantReleased || (released == 1) != tc.wantReleased || ft.stopped[0] != tc.wantReleased {
				t.Fatalf("end by %s: %v, released %d, timer stopped %v", tc.by, got, released, ft.stopped[0])
			}
			if lt.end(id, "m", "released"); released != 1 {
				t.Fatalf("released %d times", released)
			}
		})
	}
}

func TestPlacementLeasesBoundedPerMember(t *testing.T) {
	lt, _ := newTestLeases(t)
	for i := 0; i < placeMaxLeases; i++ {
		if _, err := lt.grant("m", time.Second, func() {}); err != nil {
			t.Fatalf("lease %d: %v", i, err)
		}
	}
	if _, err := lt.grant("m", time.Second, func() {}); !errors.Is(err, errTooManyLeases) {
		t.Fatalf("lease past the cap: %v", err)
	}
	if _, err := lt.grant("other", time.Second, func() {}); err != nil {
		t.Fatalf("another member's lease: %v", err)
	}
	released := 0
	lt2, _ := newTestLeases(t)
	for i := 0; i < 3; i++ {
		lt2.grant("m", time.Second, func() { released++ })
	}
	lt2.closeAll()
	if released != 3 || lt2.count() != 0 {
		t.Fatalf("close: %d released, %d held", released, lt2.count())
	}
	if _, err := lt2.grant("m", time.Second, func() {}); !errors.Is(err, errLeasesClosed) {
		t.Fatalf("a lease after close: %v", err)
	}
}

func TestLeaseTTLBounded(t *testing.T) {
	for _, tc := range []struct {
		ms   uint32
		want time.Duration
	}{
		{0, placeLeaseDefault},
		{250, 250 * time.Millisecond},
		{1 << 31, placeLeaseMax},
	} {
		if got := leaseTTL(tc.ms); got != tc.want {
			t.Errorf("leaseTTL(%d) = %v, want %v", tc.ms, got, tc.want)
		}
	}
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	if err := c.Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetCounter().GetValue()
}

func TestPlaceWantsDecodes(t *testing.T) {
	layout, k1, k2 := bytes.Repeat([]byte{9}, 16), bytes.Repeat([]byte{1}, 16), bytes.Repeat([]byte{2}, 16)
	for _, tc := range []struct {
		name  string
		req   *pb.PlaceRequest
		want  int
		valid bool
	}{
		{"two keys", &pb.PlaceRequest{Layout: layout, Size: 4096, Keys: append(append([]byte{}, k1...), k2...)}, 2, true},
		{"no keys", &pb.PlaceRequest{Layout: layout, Size: 4096}, 0, true},
		{"short layout", &pb.PlaceRequest{Layout: layout[:15], Keys: k1}, 0, false},
		{"a partial key", &pb.PlaceRequest{Layout: layout, Keys: append(append([]byte{}, k1...), 3)}, 0, false},
		{"too many keys", &pb.PlaceRequest{Layout: layout, Keys: make([]byte, 16*(placeMaxKeys+1))}, 0, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := placeWants(tc.req)
			if (err == nil) != tc.valid || len(got) != tc.want {
				t.Fatalf("%d wants, %v", len(got), err)
			}
			if tc.want == 2 && (got[1].Key[0] != 2 || got[1].Layout[0] != 9 || got[1].Size != 4096) {
				t.Fatalf("decoded %+v", got[1])
			}
		})
	}
}
