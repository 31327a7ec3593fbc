package cluster

import (
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	ibv "github.com/orbitkv/orbitkv/rdma"
)

// TestOriginIDsPastOldCap: members past 128 get origin ids up to the
// catalog's cap, lowest free first; the member past the cap is refused
// with an error that says so; a member that left gives its id back once
// its pages are out of the index, and the next member to join takes it
// without them.
func TestOriginIDsPastOldCap(t *testing.T) {
	logs := &lockedBuffer{}
	cfg := Config{NodeName: "self", ClusterInsecure: true, RDMA: ibv.Config{Off: true}}
	c, err := New(cfg, t.TempDir(), prometheus.NewRegistry(), zerolog.New(logs))
	if err != nil {
		t.Fatal(err)
	}
	up := func(name string) {
		m := meta{incarnation: 1, peerAddr: "127.0.0.1:1", dataAddr: "127.0.0.1:2"}
		c.memberUp(&memberlist.Node{Name: name, Addr: net.IPv4(127, 0, 0, 1), Port: 3, Meta: m.encode()})
	}
	idOf := func(name string) (int, bool) {
		c.mu.Lock()
		defer c.mu.Unlock()
		o := c.origins[name]
		if o == nil {
			return -1, false
		}
		return o.id, true
	}
	for i := range catalog.MaxOrigins {
		up(fmt.Sprintf("m%d", i))
		if id, ok := idOf(fmt.Sprintf("m%d", i)); !ok || id != i {
			t.Fatalf("member %d: id %d (tracked %v)", i, id, ok)
		}
	}
	up("one-too-many")
	if _, ok := idOf("one-too-many"); ok {
		t.Fatal("a member past catalog.MaxOrigins was given an id")
	}
	if !strings.Contains(logs.String(), "too many members") {
		t.Fatalf("no error logged for the member past the cap: %q", lastLine(logs.String()))
	}
	c.mu.Lock()
	_, err = c.takeIDLocked()
	c.mu.Unlock()
	if !errors.Is(err, errTooManyMembers) || !strings.Contains(err.Error(), fmt.Sprint(catalog.MaxOrigins)) {
		t.Fatalf("take past the cap: %v", err)
	}

	k := pagekey.Key{7}
	if err := c.remote.Add(1000, k, pagekey.Fingerprint{1}, 64); err != nil {
		t.Fatal(err)
	}
	c.forgetMember("m1000", false)
	c.forgetMember("m200", false)
	deadline := time.Now().Add(30 * time.Second)
	for freed := false; !freed; {
		c.mu.Lock()
		freed = !c.ids[200] && !c.ids[1000]
		c.mu.Unlock()
		if !freed && time.Now().After(deadline) {
			t.Fatal("the ids of members that left were not given back within 30 s")
		}
		if !freed {
			time.Sleep(time.Millisecond) // the release runs off the callback
		}
	}
	if _, ok := c.remote.Get(k); ok {
		t.Fatal("a page of the member that left is still in the index")
	}
	for _, id := range []int{200, 1000} {
		if addr, ok := c.DataAddr(id); ok {
			t.Fatalf("id %d of a member that left still reaches %s", id, addr)
		}
	}
	if _, ok := c.DataAddr(4000); !ok {
		t.Fatal("id 4000, a live member's, reaches nothing")
	}
	for _, tc := range []struct {
		name string
		id   int
	}{{"new-a", 200}, {"new-b", 1000}} {
		up(tc.name)
		if id, ok := idOf(tc.name); !ok || id != tc.id {
			t.Fatalf("%s: id %d (tracked %v), want %d, the lowest given back", tc.name, id, ok, tc.id)
		}
	}
	if _, ok := c.remote.Get(k); ok {
		t.Fatal("the member that took id 1000 inherited a page of the one that left")
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.byID) != len(c.origins) {
		t.Fatalf("%d members by id, %d by name", len(c.byID), len(c.origins))
	}
	for id, want := range map[int]string{200: "new-a", 1000: "new-b", 4095: "m4095"} {
		if o := c.aliveLocked(id); o == nil || o.name != want {
			t.Fatalf("id %d: member %v, want %s", id, o, want)
		}
	}
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	return s[strings.LastIndexByte(s, '\n')+1:]
}
