package cluster

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	fc "github.com/orbitkv/orbitkv/fabric/cluster"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	ibv "github.com/orbitkv/orbitkv/rdma"
)

// scalePoint is what one (hosts, pages per host) point measured.
type scalePoint struct {
	hosts, pages int
	remoteBytes  float64 // heap of the remote index per peer
	filterBytes  float64 // of which members' filters (compact; orbitkv_cluster_summary_bytes of the first member)
	idleBps      float64 // gossip bytes sent per second per peer, no page changes
	churnBps     float64 // the same with churn
	changeBytes  float64 // gossip bytes per page change per receiving member (churn less idle)
	reachP50     time.Duration
	reachMax     time.Duration
	localP99     time.Duration // a lookup of a chain this peer holds
	remoteP99    time.Duration // extending a lookup with a chain another member holds
	remoteFound  int           // pages of that chain the extension found
	againP99     time.Duration // the same chains looked up again (compact: confirmed before, no question)
	missP99      time.Duration // chains nobody holds (compact: false claims asked, at most minRun's bound)
	missFalse    float64       // false claims asked per miss lookup
	claims       [2]float64    // compact: claims confirmed held, false (one Holds each)
	chain        int           // of the chain's pages
}

func (p scalePoint) String() string {
	return fmt.Sprintf("%d hosts × %d pages: remote index %.1f MiB/peer (filters %.3f), gossip idle %.1f KB/s, churn %.1f KB/s (%.1f B/change/receiver), reach p50 %v max %v, lookup p99 local %v remote %v again %v miss %v (%d/%d found), claims confirmed %.0f held %.0f false, %.2f false per miss",
		p.hosts, p.pages, p.remoteBytes/(1<<20), p.filterBytes/(1<<20), p.idleBps/1e3, p.churnBps/1e3, p.changeBytes, p.reachP50.Round(100*time.Microsecond),
		p.reachMax.Round(100*time.Microsecond), p.localP99.Round(time.Microsecond), p.remoteP99.Round(time.Microsecond), p.againP99.Round(time.Microsecond), p.missP99.Round(time.Microsecond), p.remoteFound, p.chain, p.claims[0], p.claims[1], p.missFalse)
}

// benchLayout and benchPageBytes are every bench page's layout and size.
var benchLayout = pagekey.Fingerprint{'b', 'e', 'n', 'c', 'h'}

const benchPageBytes = 4096

// scaleMember is one in-process member with its own catalog.
type scaleMember struct {
	c    *fc.Cluster
	cat  *catalog.Catalog
	reg  *prometheus.Registry
	keys []pagekey.Key // its pages, oldest first
	slot int64
}

func (m *scaleMember) add(n int) error {
	es := make([]catalog.Entry, n)
	for i := range es {
		var k pagekey.Key
		rand.Read(k[:])
		es[i] = catalog.Entry{Key: k, Layout: benchLayout, Size: benchPageBytes, DRAMSlot: m.slot}
		m.slot++
		m.keys = append(m.keys, k)
	}
	return m.cat.Put(es...)
}

func (m *scaleMember) drop(n int) error {
	n = min(n, len(m.keys))
	gone := m.keys[:n]
	m.keys = slices.Clone(m.keys[n:])
	return m.cat.Delete(gone...)
}

// startMembers starts n members on loopback, all joining the first.
func startMembers(ctx context.Context, n int, compact bool) ([]*scaleMember, func(), error) {
	var ms []*scaleMember
	var stops []func()
	stopAll := func() {
		// In parallel: each leave waits up to a second for its broadcast.
		var wg sync.WaitGroup
		for _, stop := range stops {
			wg.Add(1)
			go func() { defer wg.Done(); stop() }()
		}
		wg.Wait()
		for _, m := range ms {
			m.cat.Close()
		}
	}
	join := ""
	for i := range n {
		cfg := fc.Config{ClusterAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0",
			NodeName: fmt.Sprintf("h%03d", i), ClusterJoin: join, ClusterInsecure: true, RDMA: ibv.Config{Off: true},
			CompactCatalog: compact}
		reg := prometheus.NewRegistry()
		c, err := fc.New(cfg, "", reg, zerolog.Nop())
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		cat, err := catalog.Open(catalog.Options{OnChange: c.Announce})
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		ms = append(ms, &scaleMember{c: c, cat: cat, reg: reg})
		stop, err := c.Start(ctx, cat, nil)
		if err != nil {
			stopAll()
			return nil, nil, err
		}
		stops = append(stops, stop)
		if join == "" {
			join = c.GossipAddr()
		}
	}
	return ms, stopAll, nil
}

// converged says whether every member's index of every other member is
// complete and holds its last change.
func converged(ms []*scaleMember) bool { return behind(ms) == 0 }

// behind counts the (member, other member) pairs where the member's index
// of the other is incomplete or lacks its last change.
func behind(ms []*scaleMember) int {
	n := 0
	for _, a := range ms {
		for _, b := range ms {
			if a == b {
				continue
			}
			if got, ok := a.c.Applied(b.c.Name()); !ok || got < b.c.Sequence() {
				n++
			}
		}
	}
	return n
}

// waitFor polls cond every step until it holds or ctx ends.
func waitFor(ctx context.Context, what string, step time.Duration, cond func() bool) error {
	for !cond() {
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for %s: %w", what, ctx.Err())
		case <-time.After(step):
		}
	}
	return nil
}

func heapAfterGC() float64 {
	runtime.GC()
	var s runtime.MemStats
	runtime.ReadMemStats(&s)
	return float64(s.HeapAlloc)
}

// localBytes is the heap of one member's own catalog of pages pages and its
// key list (compact: and its own summary, a count per bit and its keys),
// measured alone (subtracted from the heap of the whole cluster).
func localBytes(pages int, compact bool) (float64, error) {
	before := heapAfterGC()
	cat, err := catalog.Open(catalog.Options{})
	if err != nil {
		return 0, err
	}
	m := &scaleMember{cat: cat}
	for done := 0; done < pages; done += 4096 {
		if err := m.add(min(4096, pages-done)); err != nil {
			return 0, err
		}
	}
	var own *catalog.Summary
	keys := map[pagekey.Key]struct{}{}
	if compact {
		own = catalog.NewSummary(pages * 5 / 4)
		for _, k := range m.keys {
			own.Add(k, nil)
			keys[k] = struct{}{}
		}
	}
	after := heapAfterGC()
	runtime.KeepAlive(m)
	runtime.KeepAlive(own)
	runtime.KeepAlive(keys)
	cat.Close()
	return after - before, nil
}

// measurePoint starts hosts members, fills each with pages pages and
// measures the point.
func measurePoint(ctx context.Context, cfg ScaleConfig, sink *gossipCounter, hosts, pages int) (scalePoint, error) {
	pt := scalePoint{hosts: hosts, pages: pages}
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	local, err := localBytes(pages, cfg.Compact)
	if err != nil {
		return pt, err
	}
	ms, stop, err := startMembers(ctx, hosts, cfg.Compact)
	if err != nil {
		return pt, err
	}
	defer stop()
	if err := waitFor(ctx, "the cluster to form", 50*time.Millisecond, func() bool { return converged(ms) }); err != nil {
		return pt, fmt.Errorf("%w (%d of %d member pairs incomplete)", err, behind(ms), hosts*(hosts-1))
	}
	empty := heapAfterGC()
	for _, m := range ms {
		for done := 0; done < pages; done += 4096 {
			if err := m.add(min(4096, pages-done)); err != nil {
				return pt, err
			}
		}
	}
	if err := waitFor(ctx, "every index to hold every page", 50*time.Millisecond, func() bool { return converged(ms) }); err != nil {
		return pt, err
	}
	pt.remoteBytes = (heapAfterGC() - empty - float64(hosts)*local) / float64(hosts)
	if cfg.HeapProfile != "" {
		if err := writeHeapProfile(fmt.Sprintf("%s.%dx%d", cfg.HeapProfile, hosts, pages)); err != nil {
			return pt, err
		}
	}
	pt.filterBytes = gaugeValue(ms[0].reg, "orbitkv_cluster_summary_bytes")
	if err := measureGossip(ctx, cfg, sink, ms, &pt); err != nil {
		return pt, err
	}
	if err := measureReach(ctx, cfg, ms, &pt); err != nil {
		return pt, err
	}
	pt.chain = cfg.Chain
	measureLookups(cfg, ms, &pt)
	return pt, nil
}

// measureGossip measures the bytes members send, idle and with churn: once
// a second every member saves Churn/2 new pages and drops its Churn/2
// oldest.
func measureGossip(ctx context.Context, cfg ScaleConfig, sink *gossipCounter, ms []*scaleMember, pt *scalePoint) error {
	n := float64(len(ms))
	start, t0 := sink.sent(), time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(cfg.Window):
	}
	pt.idleBps = (sink.sent() - start) / time.Since(t0).Seconds() / n
	changes := 0
	start, t0 = sink.sent(), time.Now()
	for tick := 0; time.Since(t0) < cfg.Window; tick++ {
		for _, m := range ms {
			if err := m.add(cfg.Churn / 2); err != nil {
				return err
			}
			if err := m.drop(cfg.Churn / 2); err != nil {
				return err
			}
			changes += cfg.Churn / 2 * 2
		}
		next := t0.Add(time.Duration(tick+1) * time.Second)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Until(next)):
		}
	}
	secs := time.Since(t0).Seconds()
	pt.churnBps = (sink.sent() - start) / secs / n
	perHost := float64(changes) / secs / n
	pt.changeBytes = max(0, pt.churnBps-pt.idleBps) / (perHost * (n - 1))
	return waitFor(ctx, "the churn to reach every index", 50*time.Millisecond, func() bool { return converged(ms) })
}

// measureReach times single-page saves until every other member's index
// holds them.
func measureReach(ctx context.Context, cfg ScaleConfig, ms []*scaleMember, pt *scalePoint) error {
	var took []time.Duration
	for i := range cfg.Probes {
		m := ms[i%len(ms)]
		start, before := time.Now(), m.c.Sequence()
		// A page whose bits a compact filter already sets changes nothing
		// to announce: save pages until one does.
		for m.c.Sequence() == before {
			if err := m.add(1); err != nil {
				return err
			}
		}
		seq, name := m.c.Sequence(), m.c.Name()
		err := waitFor(ctx, "an announcement to reach every member", time.Millisecond, func() bool {
			for _, o := range ms {
				if got, ok := o.c.Applied(name); o != m && (!ok || got < seq) {
					return false
				}
			}
			return true
		})
		if err != nil {
			return err
		}
		took = append(took, time.Since(start))
	}
	slices.Sort(took)
	pt.reachP50, pt.reachMax = took[len(took)/2], took[len(took)-1]
	return nil
}

// measureLookups times lookups on the first member: a chain of its own
// pages (a local hit: the cluster is not asked), chains of the second
// member's (the extension of a lookup by other members' pages: with the
// compact catalog, one Holds question each), and the same chains again
// (compact: confirmed before, no question).
func measureLookups(cfg ScaleConfig, ms []*scaleMember, pt *scalePoint) {
	a, b := ms[0], ms[1]
	own := a.keys[len(a.keys)-cfg.Chain:]
	chains := len(b.keys) / cfg.Chain
	local := make([]time.Duration, cfg.Lookups)
	first := make([]time.Duration, 0, cfg.Lookups)
	again := make([]time.Duration, cfg.Lookups)
	before := claimCounts(a.reg)
	for i := range cfg.Lookups {
		t := time.Now()
		a.cat.Lookup(own, t.UnixNano())
		local[i] = time.Since(t)
		other := b.keys[(i%chains)*cfg.Chain:][:cfg.Chain]
		t = time.Now()
		pt.remoteFound = a.c.Extend(other, benchLayout, benchPageBytes)
		if i < chains {
			first = append(first, time.Since(t))
		} else {
			again[i] = time.Since(t)
		}
	}
	for i := range min(chains, cfg.Lookups) {
		other := b.keys[i*cfg.Chain:][:cfg.Chain]
		t := time.Now()
		a.c.Extend(other, benchLayout, benchPageBytes)
		again[i] = time.Since(t)
	}
	after := claimCounts(a.reg)
	pt.claims = [2]float64{after[0] - before[0], after[1] - before[1]}
	pt.localP99, pt.remoteP99, pt.againP99 = p99(local), p99(first), p99(again)
	miss := make([]time.Duration, min(cfg.Lookups, 500))
	for i := range miss {
		chain := make([]pagekey.Key, cfg.Chain)
		for j := range chain {
			rand.Read(chain[j][:])
		}
		t := time.Now()
		a.c.Extend(chain, benchLayout, benchPageBytes)
		miss[i] = time.Since(t)
	}
	pt.missP99 = p99(miss)
	pt.missFalse = (claimCounts(a.reg)[1] - after[1]) / float64(len(miss))
}

// gaugeValue reads a gauge without labels from reg (0 when absent).
func gaugeValue(reg *prometheus.Registry, name string) float64 {
	mfs, err := reg.Gather()
	if err != nil {
		return 0
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetGauge().GetValue()
		}
	}
	return 0
}

// claimCounts reads orbitkv_cluster_summary_claims_total{result="held","false"}.
func claimCounts(reg *prometheus.Registry) [2]float64 {
	var out [2]float64
	mfs, err := reg.Gather()
	if err != nil {
		return out
	}
	for _, mf := range mfs {
		if mf.GetName() != "orbitkv_cluster_summary_claims_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				switch {
				case l.GetName() == "result" && l.GetValue() == "held":
					out[0] = m.GetCounter().GetValue()
				case l.GetName() == "result" && l.GetValue() == "false":
					out[1] = m.GetCounter().GetValue()
				}
			}
		}
	}
	return out
}

func p99(ds []time.Duration) time.Duration {
	slices.Sort(ds)
	return ds[len(ds)*99/100]
}

// writeHeapProfile writes the heap's live objects to path (pprof format).
func writeHeapProfile(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return pprof.Lookup("heap").WriteTo(f, 0)
}
