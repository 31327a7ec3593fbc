package cluster

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	ibv "github.com/orbitkv/orbitkv/rdma"
)

func TestFlipsRoundTrip(t *testing.T) {
	var anns []announcement
	for i := range 700 {
		anns = append(anns, announcement{op: opSet, bit: uint32(i * 7)}, announcement{op: opClear, bit: uint32(i)})
	}
	anns = append(anns, announcement{op: opReset})
	msgs := encodeFlips("member-b", 9, 100, anns)
	var back []announcement
	next := uint64(100)
	for _, m := range msgs {
		if len(m) > maxAnnounceBytes {
			t.Fatalf("message of %d bytes", len(m))
		}
		h, body, err := decodeHead(m)
		if err != nil || h.kind != msgFlips || h.name != "member-b" || h.incarnation != 9 || h.seq != next {
			t.Fatalf("head %+v %v, want seq %d", h, err, next)
		}
		got, err := decodeFlips(body)
		if err != nil {
			t.Fatal(err)
		}
		back, next = append(back, got...), next+uint64(len(got))
	}
	if len(back) != len(anns) {
		t.Fatalf("%d flips back of %d", len(back), len(anns))
	}
	for i := range anns {
		if back[i] != anns[i] {
			t.Fatalf("flip %d: %+v, sent %+v", i, back[i], anns[i])
		}
	}
	for _, bad := range [][]byte{nil, {0, 0}, {1, 0, 1, 2, 3}, {2, 0, 1, 2, 3, 4}} {
		if _, err := decodeFlips(bad); err == nil {
			t.Errorf("decodeFlips(%v) accepted", bad)
		}
	}
}

func seededKeys(seed uint64, n int) []pagekey.Key {
	r := rand.New(rand.NewPCG(seed, 38))
	keys := make([]pagekey.Key, n)
	for i := range keys {
		for j := range keys[i] {
			keys[i][j] = byte(r.Uint32())
		}
	}
	return keys
}

// claimingAll is a filter that claims every key (every bit set).
func claimingAll(words int) catalog.Filter {
	f := make(catalog.Filter, words)
	for i := range f {
		f[i] = ^uint64(0)
	}
	return f
}

// fakeMembers holds holds[origin] leading pages of any chain; like the
// peer service's Holds, it refuses more than holdsMaxKeys keys.
// Those in silent never answer.
// deadlines counts the distinct deadlines asked within.
type fakeMembers struct {
	asked, holds      map[int]int
	silent            map[int]bool
	deadlines         map[time.Time]bool
	falseClaims, held int
}

func (f *fakeMembers) askHolds(ctx context.Context, origin int, keys []pagekey.Key) (int, error) {
	f.asked[origin]++
	if d, ok := ctx.Deadline(); ok && f.deadlines != nil {
		f.deadlines[d] = true
	}
	if f.silent[origin] {
		return 0, fmt.Errorf("holds from %d: %w", origin, context.DeadlineExceeded)
	}
	if len(keys) > holdsMaxKeys {
		return 0, fmt.Errorf("holds: %d keys, at most %d", len(keys), holdsMaxKeys)
	}
	return min(f.holds[origin], len(keys)), nil
}

func (f *fakeMembers) noteClaim(falseClaim bool) {
	if falseClaim {
		f.falseClaims++
	} else {
		f.held++
	}
}

// TestFalseClaimGoesElsewhere: origin 3's filter claims every page (all
// false positives), origin 5 holds the first two. Extend asks 3 first
// (the longest claim), hears it holds none, and counts the two pages from
// 5, within maxAsks questions; each false claim is counted, is not asked
// again, and offers 3 to no fetch.
func TestFalseClaimGoesElsewhere(t *testing.T) {
	keys := seededKeys(1, 6)
	x := newIndex()
	if err := x.sums.Replace(3, claimingAll(64)); err != nil {
		t.Fatal(err)
	}
	s := catalog.NewSummary(64)
	for _, k := range keys[:2] {
		s.Add(k, nil)
	}
	if err := x.sums.Replace(5, s.Filter()); err != nil {
		t.Fatal(err)
	}
	m := &fakeMembers{asked: map[int]int{}, holds: map[int]int{5: 2}}
	x.members = m
	asked := m.asked
	layout, size := pagekey.Fingerprint{7}, uint64(4096)
	from := x.Extend(keys, layout, size, nil)
	if len(from) != 2 || from[0] != 5 || from[1] != 5 {
		t.Fatalf("extend: %v, want [5 5]", from)
	}
	if asked[3] < 1 || asked[3]+asked[5] > maxAsks || m.falseClaims != asked[3] || m.held != asked[5] {
		t.Fatalf("asked %v, false claims %d, held %d", asked, m.falseClaims, m.held)
	}
	if p, ok := x.Get(keys[0]); !ok || p.Holders.Has(3) || !p.Holders.Has(5) || p.Layout != layout || p.Size != size {
		t.Fatalf("get: %+v %v: the fetch must go to 5 only", p, ok)
	}
	before := asked[3]
	x.Extend(keys, layout, size, nil)
	if asked[3] != before {
		t.Fatal("a refuted claim was asked again")
	}
	if got := x.Extend(keys[:1], layout, size, func(o int) bool { return o != 5 }); len(got) != 0 {
		t.Fatalf("with 5 unusable and 3 refuted: %v", got)
	}
	// A fetch that finds the page gone (store: Forget) drops the confirmation.
	x.Remove(5, keys[0])
	if p, ok := x.Get(keys[0]); ok && p.Holders.Has(5) {
		t.Fatal("a forgotten page still names its holder")
	}
}

// startCatalogMember starts a member on loopback whose catalog announces to
// it (compact: Config.CompactCatalog).
func startCatalogMember(t *testing.T, name, join string, compact bool) (*Cluster, *catalog.Catalog) {
	t.Helper()
	cfg := Config{ClusterAddr: "127.0.0.1:0", PeerAddr: "127.0.0.1:0", DataAddr: "127.0.0.1:0", NodeName: name,
		ClusterJoin: join, ClusterInsecure: true, RDMA: ibv.Config{Off: true}, CompactCatalog: compact}
	c, err := New(cfg, t.TempDir(), prometheus.NewRegistry(), zerolog.Nop())
	if err != nil {
		t.Fatal(err)
	}
	cat, err := catalog.Open(catalog.Options{OnChange: c.Announce})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cat.Close() })
	stop, err := c.Start(context.Background(), cat, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(stop)
	return c, cat
}

func caughtUp(members ...*Cluster) func() bool {
	return func() bool {
		for _, a := range members {
			for _, b := range members {
				if a == b {
					continue
				}
				if got, ok := a.Applied(b.name); !ok || got < b.Sequence() {
					return false
				}
			}
		}
		return true
	}
}

func idOf(c *Cluster, member string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.origins[member].id
}

// TestCompactCatalogMembers: two members publish compact summaries, a third
// the exact index. Each finds the others' pages (the compact ones
// confirmed by Holds), a page dropped leaves the lookups, a key a filter
// claims falsely is confirmed absent and counted, and the route ranks the
// holder with its confirmed run.
func TestCompactCatalogMembers(t *testing.T) {
	a, catA := startCatalogMember(t, "a", "", true)
	b, _ := startCatalogMember(t, "b", a.GossipAddr(), true)
	c, catC := startCatalogMember(t, "c", a.GossipAddr(), false)
	layout, size := pagekey.Fingerprint{3, 8}, uint64(4096)
	chain := seededKeys(2, 40)
	put := func(cat *catalog.Catalog, keys []pagekey.Key) {
		var es []catalog.Entry
		for i, k := range keys {
			es = append(es, catalog.Entry{Key: k, Layout: layout, Size: size, DRAMSlot: int64(i)})
		}
		if err := cat.Put(es...); err != nil {
			t.Fatal(err)
		}
	}
	put(catA, chain)
	other := seededKeys(3, 8)
	put(catC, other)
	waitUntil(t, "every index caught up", caughtUp(a, b, c), nil)
	for _, m := range []*Cluster{b, c} {
		if n := m.Extend(chain, layout, size); n != len(chain) {
			t.Fatalf("%s extends a's chain by %d, want %d", m.name, n, len(chain))
		}
		if p, ok := m.Remote(chain[5]); !ok || !p.Holders.Has(idOf(m, "a")) {
			t.Fatalf("%s: a confirmed page names no holder: %+v", m.name, p)
		}
	}
	if n := a.Extend(other, layout, size); n != len(other) {
		t.Fatalf("a (compact) finds %d of c's (exact) pages, want %d", n, len(other))
	}

	if err := catA.Delete(chain[10:]...); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the drop reached every index", caughtUp(a, b, c), nil)
	if n := b.Extend(chain, layout, size); n != 10 {
		t.Fatalf("after the drop b extends by %d, want 10", n)
	}
	hs := Rank(b.Holders(context.Background(), chain))
	if len(hs) != 1 || hs[0].Name != "a" || hs[0].Pages != 10 || !hs[0].Confirmed {
		t.Fatalf("route: %+v", hs)
	}

	// A key a's filter claims that a does not hold: one question, no page.
	idA := idOf(b, "a")
	var fake pagekey.Key
	for i := uint64(0); ; i++ {
		fake = seededKeys(100+i, 1)[0]
		if b.remote.sums.Claims(idA, fake) {
			break
		}
	}
	falseBefore := counterValue(t, b.m.claims.WithLabelValues("false"))
	if n := b.Extend([]pagekey.Key{fake}, layout, size); n != 0 {
		t.Fatalf("a false claim extended the lookup by %d", n)
	}
	if got := counterValue(t, b.m.claims.WithLabelValues("false")); got != falseBefore+1 {
		t.Fatalf("false claims counted %v, want %v", got, falseBefore+1)
	}
	if p, ok := b.Remote(fake); ok && !p.Holders.Empty() {
		t.Fatalf("a refuted page names a holder: %+v", p)
	}
}

func TestMinRun(t *testing.T) {
	for members, want := range map[int]int{0: 1, 3: 1, 10: 2, 60: 3, 127: 3, 1000: 5} {
		if got := minRun(members); got != want {
			t.Errorf("minRun(%d) = %d, want %d", members, got, want)
		}
	}
}
