package cluster

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

func TestRank(t *testing.T) {
	dram := func(n int) []catalog.Run { return []catalog.Run{{Tier: catalog.TierDRAM, Pages: n}} }
	ssdFirst := func(n int) []catalog.Run {
		return []catalog.Run{{Tier: catalog.TierSSD, Pages: 1}, {Tier: catalog.TierDRAM, Pages: n - 1}}
	}
	tests := []struct {
		name string
		in   []Holder
		want string
	}{
		{"more leading pages first", []Holder{{Name: "a", Pages: 2, State: RouteAlive, Runs: dram(2)}, {Name: "b", Pages: 5, State: RouteAlive, Runs: dram(5)}}, "b a"},
		{"no page is dropped", []Holder{{Name: "a", Self: true, State: RouteAlive}, {Name: "b", Pages: 1, State: RouteAlive, Runs: dram(1)}}, "b"},
		{"alive before suspect", []Holder{{Name: "a", Pages: 3, State: RouteSuspect}, {Name: "b", Pages: 3, State: RouteAlive, Runs: ssdFirst(3)}}, "b a"},
		{"dram lead before ssd", []Holder{{Name: "a", Pages: 3, State: RouteAlive, Runs: ssdFirst(3)}, {Name: "b", Pages: 3, State: RouteAlive, Runs: dram(3)}}, "b a"},
		{"self on a tie", []Holder{{Name: "a", Pages: 3, State: RouteAlive, Runs: dram(3)}, {Name: "z", Self: true, Pages: 3, State: RouteAlive, Runs: dram(3)}}, "z a"},
		{"name breaks the last tie", []Holder{{Name: "c", Pages: 3, State: RouteAlive, Runs: dram(3)}, {Name: "a", Pages: 3, State: RouteAlive, Runs: dram(3)}}, "a c"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var names []string
			for _, h := range Rank(tt.in) {
				names = append(names, h.Name)
			}
			if got := strings.Join(names, " "); got != tt.want {
				t.Errorf("Rank = %q, want %q (%v)", got, tt.want, fmt.Sprint(tt.in))
			}
		})
	}
}

// fakeHolds is a member's peer service that answers Holds with tiers.
type fakeHolds struct {
	pb.UnimplementedPeerServiceServer
	tiers []pb.Tier
}

func (f *fakeHolds) Holds(context.Context, *pb.HoldsRequest) (*pb.HoldsReply, error) {
	return &pb.HoldsReply{Tiers: f.tiers}, nil
}

// TestHoldersConfirm: a member's own answer replaces what gossip said of it
// (fewer pages, their tiers); a member that does not answer keeps the
// gossiped count, unconfirmed and suspect; a member that left is not asked.
func TestHoldersConfirm(t *testing.T) {
	c, b := testCluster(t)
	c.conns = map[string]*grpc.ClientConn{}
	b.peerAddr = "127.0.0.1:1" // nothing listens: b cannot confirm
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := grpc.NewServer()
	pb.RegisterPeerServiceServer(srv, &fakeHolds{tiers: []pb.Tier{pb.Tier_TIER_DRAM, pb.Tier_TIER_SSD}})
	go srv.Serve(lis)
	defer srv.Stop()
	c.putOriginLocked(&origin{name: "c", id: 4, state: stateAlive, synced: true, current: true, peerAddr: lis.Addr().String()})
	c.putOriginLocked(&origin{name: "d", id: 5, state: stateLeft})
	keys := make([]pagekey.Key, 5)
	for i := range keys {
		keys[i] = pagekey.Key{byte(i + 1)}
		for o, n := range map[int]int{3: 4, 4: 3, 5: 5} {
			if i < n {
				if err := c.remote.Add(o, keys[i], pagekey.Fingerprint{1}, 64); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var got []string
	for _, h := range Rank(c.Holders(ctx, keys)) {
		got = append(got, fmt.Sprintf("%s %s %d %v %v", h.Name, h.State, h.Pages, h.Runs, h.Confirmed))
	}
	want := []string{"b suspect 4 [{none 4}] false", "c alive 2 [{dram 1} {ssd 1}] true"}
	if strings.Join(got, "; ") != strings.Join(want, "; ") {
		t.Fatalf("Holders = %q, want %q", got, want)
	}
}

// failingHolds is a member's peer service that counts Holds and fails it.
type failingHolds struct {
	pb.UnimplementedPeerServiceServer
	calls atomic.Int32
}

func (f *failingHolds) Holds(context.Context, *pb.HoldsRequest) (*pb.HoldsReply, error) {
	f.calls.Add(1)
	return nil, status.Error(codes.Unavailable, "busy")
}

// TestHoldersPassOverSilentMember: a member that failed to confirm is kept
// suspect with its gossiped count and not asked again until silentTTL has
// passed on the index's clock, so route queries do not each wait for it.
func TestHoldersPassOverSilentMember(t *testing.T) {
	c, b := testCluster(t)
	c.conns = map[string]*grpc.ClientConn{}
	now := time.Date(2026, 12, 5, 0, 0, 0, 0, time.UTC)
	c.remote.now = func() time.Time { return now }
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &failingHolds{}
	srv := grpc.NewServer()
	pb.RegisterPeerServiceServer(srv, f)
	go srv.Serve(lis)
	defer srv.Stop()
	b.peerAddr = lis.Addr().String()
	keys := []pagekey.Key{{1}, {2}, {3}}
	for _, k := range keys {
		if err := c.remote.Add(b.id, k, pagekey.Fingerprint{1}, 64); err != nil {
			t.Fatal(err)
		}
	}
	ask := func(wantCalls int32) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		hs := c.Holders(ctx, keys)
		if len(hs) != 1 || hs[0].Name != "b" || hs[0].State != RouteSuspect || hs[0].Pages != 3 || hs[0].Confirmed {
			t.Fatalf("Holders = %+v, want b suspect with its 3 gossiped pages", hs)
		}
		if got := f.calls.Load(); got != wantCalls {
			t.Fatalf("b asked %d times, want %d", got, wantCalls)
		}
	}
	ask(1) // asked, failed: silent now
	ask(1) // passed over
	now = now.Add(silentTTL)
	ask(2) // asked again once the silence ended
}
