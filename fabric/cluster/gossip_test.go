package cluster

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func ann(i int, op uint8) announcement {
	a := announcement{op: op, key: pagekey.Key{byte(i), byte(i >> 8), 1}}
	if op == opHave {
		a.layout, a.size = pagekey.Fingerprint{5}, uint64(100+i)
	}
	return a
}

func TestAnnouncementsRoundTrip(t *testing.T) {
	var anns []announcement
	for i := range 100 {
		anns = append(anns, ann(i, opHave+uint8(i%3/2)))
	}
	msgs := encodeAnnouncements("node-a", 42, 7, anns)
	if len(msgs) < 3 {
		t.Fatalf("100 announcements in %d messages", len(msgs))
	}
	var got []announcement
	next := uint64(7)
	for _, m := range msgs {
		if len(m) > maxAnnounceBytes {
			t.Fatalf("message of %d bytes", len(m))
		}
		h, body, err := decodeHead(m)
		if err != nil || h.name != "node-a" || h.incarnation != 42 || h.seq != next {
			t.Fatalf("head %+v %v, want seq %d", h, err, next)
		}
		as, err := decodeAnnouncements(body)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, as...)
		next += uint64(len(as))
	}
	if fmt.Sprint(got) != fmt.Sprint(anns) {
		t.Fatal("announcements differ after a round trip")
	}
	m := meta{incarnation: 9, peerAddr: "10.0.0.1:7947", dataAddr: "[::1]:7948"}
	if back, err := decodeMeta(m.encode()); err != nil || back.proof != nil || back.incarnation != m.incarnation ||
		back.peerAddr != m.peerAddr || back.dataAddr != m.dataAddr || back.rdma != m.rdma {
		t.Fatalf("meta round trip: %+v %v", back, err)
	}
}

// testCluster is a cluster with one member, "b", and no network.
func testCluster(t *testing.T) (*Cluster, *origin) {
	c := &Cluster{name: "a", log: zerolog.Nop(), remote: newIndex(), origins: map[string]*origin{}}
	c.m = newClusterMetrics(prometheus.NewRegistry(), c.remote)
	o := &origin{name: "b", id: 3, incarnation: 11, state: stateAlive, synced: true}
	c.putOriginLocked(o)
	return c, o
}

// TestAnnouncementsApplyInOrder: announcements apply in sequence; a
// duplicate is ignored; one after a hole waits, and the hole makes the
// member due for a snapshot after the grace period; an announcement of
// another incarnation is ignored.
func TestAnnouncementsApplyInOrder(t *testing.T) {
	c, o := testCluster(t)
	send := func(inc, first uint64, anns ...announcement) {
		for _, m := range encodeAnnouncements("b", inc, first, anns) {
			c.receive(m)
		}
	}
	send(11, 1, ann(1, opHave), ann(2, opHave))
	send(11, 1, ann(1, opHave), ann(2, opHave)) // delivered twice
	send(11, 3, ann(1, opDrop))
	if o.applied != 3 || c.remote.Count(3) != 1 {
		t.Fatalf("applied %d, pages %d", o.applied, c.remote.Count(3))
	}
	send(11, 6, ann(6, opHave)) // 4 and 5 lost
	if o.applied != 3 || c.remote.Count(3) != 1 || o.gapSince.IsZero() {
		t.Fatalf("after a hole: applied %d pages %d gap %v", o.applied, c.remote.Count(3), o.gapSince)
	}
	if needsSyncLocked(o, time.Now()) || !needsSyncLocked(o, time.Now().Add(gapGrace+time.Millisecond)) {
		t.Fatal("a hole must make the member due for a snapshot after the grace period, not before")
	}
	send(11, 4, ann(4, opHave), ann(5, opHave)) // reordered, not lost: the hole fills
	if o.applied != 6 || c.remote.Count(3) != 4 || !o.gapSince.IsZero() {
		t.Fatalf("after the hole filled: applied %d pages %d gap %v", o.applied, c.remote.Count(3), o.gapSince)
	}
	send(12, 7, ann(7, opHave)) // a new life of b: membership resets it first
	if c.remote.Count(3) != 4 {
		t.Fatal("an announcement of another incarnation was applied")
	}
	c.receive(encodeState("b", 11, 9)) // b says it sent up to 9
	if o.behindSince.IsZero() || !needsSyncLocked(o, time.Now().Add(behindGrace+time.Millisecond)) {
		t.Fatal("a member ahead of what arrived must become due for a snapshot")
	}
	c.receive([]byte("garbage"))
	if c.remote.Count(3) != 4 || c.remote.Len() != 4 {
		t.Fatal("garbage changed the index")
	}
}

func FuzzGossipMessage(f *testing.F) {
	for _, m := range encodeAnnouncements("n", 1, 1, []announcement{ann(1, opHave), ann(2, opDrop)}) {
		f.Add(m)
	}
	for _, m := range encodeFlips("n", 1, 1, []announcement{{op: opSet, bit: 9}, {op: opClear, bit: 9}, {op: opReset}}) {
		f.Add(m)
	}
	f.Add(encodeState("n", 1, 5))
	f.Add(meta{incarnation: 1, peerAddr: "1.2.3.4:5", dataAddr: "1.2.3.4:6"}.encode())
	f.Fuzz(func(t *testing.T, b []byte) {
		if h, body, err := decodeHead(b); err == nil && h.kind == msgAnnounce {
			if anns, err := decodeAnnouncements(body); err == nil {
				for _, a := range anns {
					if a.op != opHave && a.op != opDrop || a.op == opHave && a.size == 0 {
						t.Fatalf("accepted %+v", a)
					}
				}
			}
		}
		if h, body, err := decodeHead(b); err == nil && h.kind == msgFlips {
			if anns, err := decodeFlips(body); err == nil {
				for _, a := range anns {
					if a.op != opSet && a.op != opClear && a.op != opReset || a.bit >= flipSet {
						t.Fatalf("accepted %+v", a)
					}
				}
			}
		}
		decodeMeta(b)
		if anns, err := decodeSnapshotEntries(b); err == nil && len(anns)*snapshotEntrySize != len(b) {
			t.Fatal("snapshot entries miscounted")
		}
		c, _ := testCluster(t)
		c.receive(b) // must not panic whatever arrives
	})
}
