package cluster

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/transfer"
	"github.com/orbitkv/orbitkv/transfer/transporttest"
)

func TestChooseTransport(t *testing.T) {
	for _, tc := range []struct {
		name       string
		local      string
		memberRDMA bool
		state      linkState
		lastErr    string
		want       choice
	}{
		{"no local device", "no local device", true, linkUp, "", choice{"tcp", "no local device"}},
		{"rdma off here", "rdma off", true, linkNone, "", choice{"tcp", "rdma off"}},
		{"member has no device", "", false, linkNone, "", choice{"tcp", "member has no device"}},
		{"exchange not done yet", "", true, linkNone, "", choice{"tcp", "rdma connecting"}},
		{"exchange failed", "", true, linkFailed, "refused", choice{"tcp", "rdma exchange failed: refused"}},
		{"both ends and the exchange", "", true, linkUp, "", choice{"rdma", ""}},
		{"lane down after use", "", true, linkDown, "no usable lane", choice{"tcp", "rdma lane down"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := chooseTransport(tc.local, tc.memberRDMA, tc.state, tc.lastErr); got != tc.want {
				t.Fatalf("got %+v, want %+v", got, tc.want)
			}
		})
	}
}

// fakeLane is a FAKE RDMA transport: descriptor i fails with errs[i] (nil:
// it completes, without moving bytes). Not the verbs: what the cluster sees
// of a lane.
type fakeLane struct {
	errs  map[int]error
	calls int
}

func (f *fakeLane) Name() string { return "rdma" }

func (f *fakeLane) Submit(_ context.Context, _ string, batch []transfer.RemoteDesc) []transfer.Completion {
	f.calls++
	out := make([]transfer.Completion, len(batch))
	for i := range out {
		out[i].Err = f.errs[i]
	}
	return out
}

// TestFallbackCarriesWhatRDMACannot: on a member's RDMA route, descriptors
// the lane cannot carry (unsupported, lane down, closed) move over TCP and
// arrive; a page the member does not hold is not retried; a lane down is
// reported once per batch.
func TestFallbackCarriesWhatRDMACannot(t *testing.T) {
	tcp := transporttest.NewMemory()
	r := rand.New(rand.NewPCG(1, 2))
	local := transfer.HostRegion("local", make([]byte, 5*4096))
	var batch []transfer.RemoteDesc
	var want [][]byte
	for i := range 5 {
		data := make([]byte, 4096)
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		h := page.Header{Key: pagekey.Key{byte(i + 1)}, Length: 4096, Checksum: page.Checksum(data)}
		batch = append(batch, transfer.RemoteDesc{Op: transfer.Read, Remote: tcp.Put(h, data), Len: 4096, Local: local, LocalOff: uint64(i * 4096)})
		want = append(want, data)
	}
	lane := &fakeLane{errs: map[int]error{
		1: fmt.Errorf("no placement: %w", transfer.ErrUnsupported),
		2: fmt.Errorf("read: %w", ibv.ErrLaneDown),
		3: fmt.Errorf("page: %w", transfer.ErrRemoteNotFound),
		4: fmt.Errorf("read: %w", ibv.ErrClosed),
	}}
	var downs []error
	carried := prometheus.NewCounter(prometheus.CounterOpts{Name: "carried"})
	f := &fallback{member: "m", rdma: lane, tcp: tcp, down: func(err error) { downs = append(downs, err) }, tcpPages: carried}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := f.Submit(ctx, "data-addr", batch)
	for _, i := range []int{1, 2, 4} {
		if got[i].Err != nil || string(batch[i].LocalBytes()) != string(want[i]) || got[i].Header.Verify(batch[i].LocalBytes()) != nil {
			t.Fatalf("descriptor %d not carried over TCP: %v", i, got[i].Err)
		}
	}
	if got[0].Err != nil || !errors.Is(got[3].Err, transfer.ErrRemoteNotFound) {
		t.Fatalf("rdma's own results changed: %v, %v", got[0].Err, got[3].Err)
	}
	if len(downs) != 1 || !errors.Is(downs[0], ibv.ErrLaneDown) {
		t.Fatalf("lane down reported %d times: %v", len(downs), downs)
	}
	if got := counterValue(t, carried); got != 3 {
		t.Fatalf("pages counted as carried over tcp: %v, want 3", got)
	}
}

// tornLane is a FAKE RDMA transport that READs each page from src and
// answers its header, flipping a byte of the pages in torn (as a READ of a
// slot the holder rewrote under it would).
type tornLane struct {
	src  *transporttest.Memory
	torn map[int]bool
}

func (f *tornLane) Name() string { return "rdma" }

func (f *tornLane) Submit(ctx context.Context, endpoint string, batch []transfer.RemoteDesc) []transfer.Completion {
	out := f.src.Submit(ctx, endpoint, batch)
	for i := range out {
		out[i].Verified = false
		if f.torn[i] {
			batch[i].LocalBytes()[7] ^= 0x5a
		}
	}
	return out
}

// TestFallbackRetriesATornReadOverTCP: a page READ whose bytes fail its
// checksum is fetched again over TCP and arrives right (counted as carried
// over TCP); a page READ whole is marked verified and not sent again.
func TestFallbackRetriesATornReadOverTCP(t *testing.T) {
	tcp := transporttest.NewMemory()
	local := transfer.HostRegion("local", make([]byte, 2*4096))
	var batch []transfer.RemoteDesc
	var want [][]byte
	for i := range 2 {
		data := bytes.Repeat([]byte{byte(i + 1), 0x33}, 2048)
		h := page.Header{Key: pagekey.Key{byte(i + 1)}, Length: 4096, Checksum: page.Checksum(data)}
		batch = append(batch, transfer.RemoteDesc{Op: transfer.Read, Remote: tcp.Put(h, data), Len: 4096, Local: local, LocalOff: uint64(i * 4096)})
		want = append(want, data)
	}
	carried := prometheus.NewCounter(prometheus.CounterOpts{Name: "carried"})
	f := &fallback{member: "m", rdma: &tornLane{src: tcp, torn: map[int]bool{1: true}}, tcp: tcp,
		down: func(err error) { t.Fatalf("lane reported down: %v", err) }, tcpPages: carried}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	got := f.Submit(ctx, "data-addr", batch)
	for i := range batch {
		if got[i].Err != nil || !bytes.Equal(batch[i].LocalBytes(), want[i]) || got[i].Header.Verify(batch[i].LocalBytes()) != nil {
			t.Fatalf("page %d: %v (bytes right: %v)", i, got[i].Err, bytes.Equal(batch[i].LocalBytes(), want[i]))
		}
	}
	if !got[0].Verified {
		t.Fatal("the page READ whole is not marked verified")
	}
	if got := counterValue(t, carried); got != 1 {
		t.Fatalf("pages carried over tcp: %v, want 1 (the torn one)", got)
	}
}

// TestLaneDownFallsBackOnceAndShows: a member whose lane goes down is
// reached over TCP until a fresh connection is dialed (rdmaRetryAfter
// later), counted once however many batches see it, and its transport
// gauge moves from rdma to tcp.
func TestLaneDownFallsBackOnceAndShows(t *testing.T) {
	reg := prometheus.NewRegistry()
	r := newRDMASide(ibv.Config{}, reg, zerolog.Nop())
	r.why = ""                             // as if a device had opened (no verbs are called below)
	r.mu.links["m"] = &link{state: linkUp} // dialed (no Conn: nothing is sent)
	r.show("m", r.choice("m", true))
	if ch := r.choice("m", true); ch.transport != "rdma" {
		t.Fatalf("lane up: %+v", ch)
	}
	if got := series(t, reg, "orbitkv_cluster_member_transport"); len(got) != 1 || got[`member="m",transport="rdma"`] != 1 {
		t.Fatalf("transport gauge %v", got)
	}
	for range 3 {
		r.laneDown("m", ibv.ErrLaneDown)
	}
	if ch := r.choice("m", true); ch != (choice{"tcp", "rdma lane down"}) {
		t.Fatalf("after the lane went down: %+v", ch)
	}
	if got := series(t, reg, "orbitkv_cluster_transport_fallbacks_total"); got[""] != 1 {
		t.Fatalf("fallbacks %v, want 1", got)
	}
	if got := series(t, reg, "orbitkv_cluster_member_transport"); len(got) != 1 || got[`member="m",transport="tcp"`] != 1 {
		t.Fatalf("transport gauge after the fallback: %v", got)
	}
	if _, err := r.connOf("m"); !errors.Is(err, ibv.ErrLaneDown) {
		t.Fatalf("conn of a member whose lane is down: %v", err)
	}
	// Not for good: a fresh connection is dialed rdmaRetryAfter later (a
	// link that came back carries RDMA again).
	r.eng = &ibv.Engine{} // due dials only with an engine; nothing is called on it
	defer func() { r.eng = nil }()
	now := time.Now()
	if got := r.due(map[string]bool{"m": true}, now); len(got) != 0 {
		t.Fatalf("redialed at once after the lane went down: %v", got)
	}
	if got := r.due(map[string]bool{"m": true}, now.Add(rdmaRetryAfter+time.Second)); len(got) != 1 {
		t.Fatalf("not redialed %v after the lane went down: %v", rdmaRetryAfter, got)
	}
	r.forget("m")
	if got := series(t, reg, "orbitkv_cluster_member_transport"); len(got) != 0 {
		t.Fatalf("a member that left keeps transport series %v", got)
	}
}

// series is the values of metric family name by label set (k="v",…).
func series(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, f := range fams {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			var labels []string
			for _, l := range m.GetLabel() {
				labels = append(labels, fmt.Sprintf("%s=%q", l.GetName(), l.GetValue()))
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			out[strings.Join(labels, ",")] = v
		}
	}
	return out
}

// TestConnectionIDBelongsToItsSender: only the member that first sent a
// connection ID may send it again (reconnect its lanes); another member's
// attempt is refused and changes nothing.
func TestConnectionIDBelongsToItsSender(t *testing.T) {
	r := newRDMASide(ibv.Config{}, prometheus.NewRegistry(), zerolog.Nop())
	for _, tc := range []struct {
		id     uint64
		member string
		ok     bool
	}{
		{7, "a", true},
		{7, "a", true}, // a reconnects its own
		{7, "b", false},
		{8, "b", true},
		{7, "a", true}, // b's attempt did not take 7 over
	} {
		if err := r.owner(tc.id, tc.member); (err == nil) != tc.ok {
			t.Fatalf("id %d from %s: %v, want ok=%v", tc.id, tc.member, err, tc.ok)
		}
	}
	r.forget("a")
	if err := r.owner(7, "b"); err != nil {
		t.Fatalf("an ID of a member that left: %v", err)
	}
}

// TestMetaCarriesTheRDMAFlag: the flag round-trips, and metadata of a peer
// that sends no flags byte reads as no device.
func TestMetaCarriesTheRDMAFlag(t *testing.T) {
	for _, rdma := range []bool{false, true} {
		m := meta{incarnation: 3, peerAddr: "10.0.0.1:1", dataAddr: "10.0.0.1:2", rdma: rdma}
		got, err := decodeMeta(m.encode())
		got.signed = nil
		if err != nil || !reflect.DeepEqual(got, m) {
			t.Fatalf("round trip: %+v, %v", got, err)
		}
	}
	old := meta{incarnation: 3, peerAddr: "10.0.0.1:1", dataAddr: "10.0.0.1:2", rdma: true}.encode()
	got, err := decodeMeta(old[:len(old)-1])
	if err != nil || got.rdma {
		t.Fatalf("metadata without flags: %+v, %v", got, err)
	}
}

func TestNoDeviceLine(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want string
	}{
		{ibv.ErrNoDevice, "rdma: no RDMA device; data plane uses TCP"},
		{fmt.Errorf("%w (the kernel has no RDMA support): list devices: errno 38", ibv.ErrNoDevice),
			"rdma: no RDMA device (the kernel has no RDMA support: list devices: errno 38); data plane uses TCP"},
		{ibv.ErrNoLibrary, "rdma: no RDMA device (libibverbs not found: no RDMA device); data plane uses TCP"},
	} {
		if got := noDeviceLine(tc.err); got != tc.want {
			t.Errorf("%v:\n got %q\nwant %q", tc.err, got, tc.want)
		}
	}
}
