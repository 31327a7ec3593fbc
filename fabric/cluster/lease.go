package cluster

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// The member's side of page placements (place.go): the leases it holds for
// members' RDMA reads, each bounded in time and in number.

// Bounds of placement leases.
const (
	placeLeaseDefault  = 5 * time.Second  // lease_ms 0
	placeLeaseMax      = 30 * time.Second // the longest lease granted
	placeMaxKeys       = 4096             // pages per PlacePages
	placeMaxLeases     = 64               // leases one member may hold at once
	placeCallWithin    = 2 * time.Second  // a PlacePages call (within the batch's own deadline)
	placeReleaseWithin = 2 * time.Second  // a ReleasePlacements call
)

// leaseTable holds the placements members hold. after is time.AfterFunc
// (injected: tests end leases when they choose).
type leaseTable struct {
	after func(time.Duration, func()) (stop func() bool)
	ended *prometheus.CounterVec // orbitkv_cluster_placement_leases_total{end}

	mu        sync.Mutex
	next      uint64
	held      map[uint64]*placeLease
	perMember map[string]int
	closed    bool // closeAll ran: no new leases (a handler may outlive the server's Stop)
}

type placeLease struct {
	member  string
	release func()
	stop    func() bool
}

func newLeaseTable(reg *prometheus.Registry) *leaseTable {
	t := &leaseTable{
		after: func(d time.Duration, f func()) func() bool { return time.AfterFunc(d, f).Stop },
		ended: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "cluster", Name: "placement_leases_total",
			Help: "Page placement leases members held for RDMA reads, by how they ended (released, expired, closed)."}, []string{"end"}),
		held: map[uint64]*placeLease{}, perMember: map[string]int{},
	}
	for _, e := range []string{"released", "expired", "closed"} {
		t.ended.WithLabelValues(e)
	}
	held := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "orbitkv", Subsystem: "cluster", Name: "placement_leases_held",
		Help: "Page placement leases members hold now (each pins pages in DRAM for their RDMA reads)."}, func() float64 { return float64(t.count()) })
	reg.MustRegister(t.ended, held)
	return t
}

// errTooManyLeases reports a member at placeMaxLeases.
var errTooManyLeases = errors.New("too many placement leases held")

// errLeasesClosed reports a placement asked for while the cluster stops.
var errLeasesClosed = errors.New("placement leases closed: the peer is stopping")

// grant records a lease of member's that runs release when it ends, at
// the latest after ttl.
func (t *leaseTable) grant(member string, ttl time.Duration, release func()) (uint64, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, errLeasesClosed
	}
	if t.perMember[member] >= placeMaxLeases {
		return 0, fmt.Errorf("member %s: %w (%d)", member, errTooManyLeases, placeMaxLeases)
	}
	t.next++
	id := t.next
	l := &placeLease{member: member, release: release}
	t.held[id], t.perMember[member] = l, t.perMember[member]+1
	l.stop = t.after(ttl, func() { t.end(id, "", "expired") })
	return id, nil
}

// end ends lease id (member "" for any member's) and runs its release;
// false when it had ended or belongs to another member.
func (t *leaseTable) end(id uint64, member, how string) bool {
	t.mu.Lock()
	l := t.held[id]
	if l == nil || member != "" && l.member != member {
		t.mu.Unlock()
		return false
	}
	delete(t.held, id)
	if t.perMember[l.member]--; t.perMember[l.member] == 0 {
		delete(t.perMember, l.member)
	}
	t.mu.Unlock()
	if how != "expired" {
		l.stop()
	}
	l.release()
	t.ended.WithLabelValues(how).Inc()
	return true
}

// closeAll ends every lease (the cluster stops).
func (t *leaseTable) closeAll() {
	t.mu.Lock()
	t.closed = true
	ids := make([]uint64, 0, len(t.held))
	for id := range t.held {
		ids = append(ids, id)
	}
	t.mu.Unlock()
	for _, id := range ids {
		t.end(id, "", "closed")
	}
}

// count is how many leases are held (orbitkv_cluster_placement_leases_held).
func (t *leaseTable) count() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.held)
}

// leaseTTL is the lease a request asks for, bounded.
func leaseTTL(ms uint32) time.Duration {
	d := time.Duration(ms) * time.Millisecond
	switch {
	case d == 0:
		return placeLeaseDefault
	case d > placeLeaseMax:
		return placeLeaseMax
	}
	return d
}

// placeWants decodes a PlaceRequest's pages.
func placeWants(req *pb.PlaceRequest) ([]tcp.Want, error) {
	var layout pagekey.Fingerprint
	if len(req.Layout) != len(layout) {
		return nil, fmt.Errorf("layout: %d bytes, want %d", len(req.Layout), len(layout))
	}
	copy(layout[:], req.Layout)
	if len(req.Keys)%pagekey.Size != 0 || len(req.Keys)/pagekey.Size > placeMaxKeys {
		return nil, fmt.Errorf("keys: %d bytes, want a multiple of %d, at most %d keys", len(req.Keys), pagekey.Size, placeMaxKeys)
	}
	wants := make([]tcp.Want, len(req.Keys)/pagekey.Size)
	for i := range wants {
		copy(wants[i].Key[:], req.Keys[i*pagekey.Size:])
		wants[i].Layout, wants[i].Size = layout, req.Size
	}
	return wants, nil
}
