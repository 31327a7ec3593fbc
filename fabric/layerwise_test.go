package fabric

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/orbitkv/orbitkv/cuda"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
	"github.com/orbitkv/orbitkv/tiers/dram"
	"github.com/orbitkv/orbitkv/transfer"
)

// fakeGPU is a device transport over host memory: it copies with memmove
// and logs what a layer-wise batch enqueues ("L<layer>" per descriptor's
// destination layer, "mark <g>" per recorded mark). enter, when set, is
// signalled as StartGroups begins and gate holds it there; hold keeps a
// flight's copy from completing until closed.
type fakeGPU struct {
	f     engineclient.Flash
	base  uint64 // the engine buffer's region, to tell layers apart
	enter chan int
	gate  chan struct{}
	hold  chan struct{}
	// Gated loads: gated makes OpenGates arm (log "gates"), gatedHold keeps
	// StartGated from starting until closed, failGroup > 0 fails StartGated
	// at that group after enqueueing the ones before it.
	gated     bool
	gatedHold chan struct{}
	failGroup int
	// stuck makes every copy end with transfer.ErrStuck, moving nothing:
	// a device copy that never finished.
	stuck bool
	// failPeer fails every device-to-device copy (CopyFrom).
	failPeer bool

	mu struct {
		sync.Mutex
		peerCopies int
		log        []string
		calls      int
		running    int
		overlap    bool
		gen        uint32
		words      []uint32 // gate words, one per layer
	}
}

type fakeGate struct {
	d        *fakeGPU
	gen      uint32
	released int
}

func (g *fakeGate) Release() {
	g.d.mu.Lock()
	defer g.d.mu.Unlock()
	g.released++
	if g.released == 1 {
		for l := range g.d.mu.words {
			g.d.mu.words[l] = g.gen
		}
		g.d.mu.log = append(g.d.mu.log, "release")
	}
}

func (d *fakeGPU) OpenGates(m *transfer.Marks) (transfer.Gate, error) {
	if !d.gated {
		return nil, nil
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.mu.words == nil {
		d.mu.words = make([]uint32, m.Len())
	}
	d.mu.gen++
	d.mu.log = append(d.mu.log, "gates")
	return &fakeGate{d: d, gen: d.mu.gen}, nil
}

func (d *fakeGPU) StartGated(ctx context.Context, groups [][]transfer.Desc, gate transfer.Gate) (transfer.Flight, error) {
	g := gate.(*fakeGate)
	if d.gatedHold != nil {
		<-d.gatedHold
	}
	layerBytes := uint64(2 * d.f.NumBlocks * d.f.BlockBytes())
	d.mu.Lock()
	defer d.mu.Unlock()
	for i, b := range groups {
		if d.failGroup > 0 && i == d.failGroup {
			g.released++ // as transfer.CUDA.StartGated: release before returning
			for l := range d.mu.words {
				d.mu.words[l] = g.gen
			}
			d.mu.log = append(d.mu.log, "release")
			return nil, fmt.Errorf("fake enqueue failure at group %d", i)
		}
		for _, x := range b {
			d.mu.log = append(d.mu.log, fmt.Sprintf("L%d", x.DstOff/layerBytes))
		}
		d.mu.words[i] = g.gen
		d.mu.log = append(d.mu.log, fmt.Sprintf("open %d", i))
	}
	return &fakeFlight{d: d, groups: groups}, nil
}

func (d *fakeGPU) Copy(ctx context.Context, batch []transfer.Desc) error {
	return transfer.Local{}.Copy(ctx, batch)
}

// CopyFrom is a device-to-device copy (the HBM stage's); failPeer fails
// it, moving nothing, and stuck makes it end with transfer.ErrStuck.
func (d *fakeGPU) CopyFrom(ctx context.Context, _ transfer.PeerSource, batch []transfer.Desc) error {
	d.mu.Lock()
	d.mu.peerCopies++
	d.mu.Unlock()
	switch {
	case d.stuck:
		return fmt.Errorf("fake peer copy: %w", transfer.ErrStuck)
	case d.failPeer:
		return errors.New("fake peer copy failure")
	}
	return d.Copy(ctx, batch)
}

func (d *fakeGPU) PeerDevice() *cuda.Device { return nil }

func (d *fakeGPU) CopyGroups(ctx context.Context, groups [][]transfer.Desc, done func(g int)) error {
	for g, b := range groups {
		if err := d.Copy(ctx, b); err != nil {
			return err
		}
		if done != nil {
			done(g)
		}
	}
	return nil
}

// Begin returns a stream that copies each part as it is added.
func (d *fakeGPU) Begin(context.Context) (transfer.CopyStream, error) { return &fakeStream{d: d}, nil }

type fakeStream struct {
	d   *fakeGPU
	err error
}

func (s *fakeStream) Add(batch []transfer.Desc) error {
	switch {
	case s.err != nil:
	case s.d.stuck:
		s.err = fmt.Errorf("fake copy: %w", transfer.ErrStuck)
	default:
		s.err = s.d.Copy(context.Background(), batch)
	}
	return s.err
}

func (s *fakeStream) Finish(ctx context.Context) error {
	if s.d.hold != nil {
		select {
		case <-s.d.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.err
}

func (d *fakeGPU) NewMarks(n int) (*transfer.Marks, error) {
	m := &transfer.Marks{Events: make([]*cuda.Event, n)}
	for i := range n {
		m.Handles = append(m.Handles, bytes.Repeat([]byte{byte(i + 1)}, 64))
	}
	return m, nil
}

func (d *fakeGPU) StartGroups(ctx context.Context, groups [][]transfer.Desc, marks *transfer.Marks) (transfer.Flight, error) {
	d.mu.Lock()
	d.mu.calls++
	d.mu.running++
	d.mu.overlap = d.mu.overlap || d.mu.running > 1
	call := d.mu.calls
	d.mu.Unlock()
	defer func() { d.mu.Lock(); d.mu.running--; d.mu.Unlock() }()
	if d.enter != nil {
		d.enter <- call
	}
	if d.gate != nil {
		<-d.gate
	}
	if marks.Len() != len(groups) {
		return nil, fmt.Errorf("%d marks for %d groups", marks.Len(), len(groups))
	}
	layerBytes := uint64(2 * d.f.NumBlocks * d.f.BlockBytes())
	d.mu.Lock()
	for g, b := range groups {
		for _, x := range b {
			d.mu.log = append(d.mu.log, fmt.Sprintf("L%d", x.DstOff/layerBytes))
		}
		d.mu.log = append(d.mu.log, fmt.Sprintf("mark %d", g))
	}
	d.mu.Unlock()
	return &fakeFlight{d: d, groups: groups}, nil
}

type fakeFlight struct {
	d      *fakeGPU
	groups [][]transfer.Desc
}

func (f *fakeFlight) Wait(ctx context.Context) error {
	if f.d.stuck {
		return fmt.Errorf("fake copy: %w", transfer.ErrStuck)
	}
	if f.d.hold != nil {
		select {
		case <-f.d.hold:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return f.d.CopyGroups(ctx, f.groups, nil)
}

func (d *fakeGPU) takeLog() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	l := d.mu.log
	d.mu.log = nil
	return l
}

var layerFlash = engineclient.Flash{Layers: 4, NumBlocks: 64, BlockTokens: 4, PageTokens: 16, KVHeads: 2, HeadDim: 16, ElemBytes: 4}

// layerwiseEngine is a shared-memory engine whose session the peer treats
// as a CUDA session with layer events, through fakeGPU.
func layerwiseEngine(t *testing.T) (*testPeer, *engine, *fakeGPU) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(layerFlash)
	sess, err := tp.p.api.Engine(e.Session)
	if err != nil {
		t.Fatal(err)
	}
	fake := &fakeGPU{f: layerFlash}
	sess.GPU = fake
	if sess.Marks, err = fake.NewMarks(layerFlash.Layers); err != nil {
		t.Fatal(err)
	}
	return tp, e, fake
}

func TestLayerwiseLoadPlansLayerMajorAndAnswersOnEnqueue(t *testing.T) {
	tp, e, fake := layerwiseEngine(t)
	const pages, perPage = 3, 4
	keys := randKeys(pages)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, perPage), pb.Durability_DURABILITY_DRAM))
	want := make([][]byte, pages)
	for i := range pages {
		want[i] = e.page(refs(keys, 0, perPage)[i].Blocks)
	}
	fake.takeLog()
	fake.hold = make(chan struct{})
	dst := refs(keys, 32, perPage)
	h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: dst, Layerwise: true})
	if err != nil {
		t.Fatalf("layer-wise load: %v", err)
	}
	// The call answered with the batch enqueued and the copy still held.
	var wantLog []string
	for l := range layerFlash.Layers {
		for range pages {
			wantLog = append(wantLog, fmt.Sprintf("L%d", l), fmt.Sprintf("L%d", l)) // K, V (4 blocks each merge)
		}
		wantLog = append(wantLog, fmt.Sprintf("mark %d", l))
	}
	if got := fake.takeLog(); fmt.Sprint(got) != fmt.Sprint(wantLog) {
		t.Fatalf("enqueued\n %v\nwant (layer-major, a mark after each layer)\n %v", got, wantLog)
	}
	st, err := e.C.Wait(ctx(t), &pb.WaitRequest{SessionId: e.Session, OpId: h.OpId})
	if err != nil || st.Done {
		t.Fatalf("op done before its device copy completed: %v %v", st, err)
	}
	if bytes.Equal(e.page(dst[0].Blocks), want[0]) {
		t.Fatal("bytes in place before the flight completed")
	}
	close(fake.hold)
	st, err = e.Wait(ctx(t), h.OpId)
	mustOK(t, st, err)
	for i := range pages {
		if !bytes.Equal(e.page(dst[i].Blocks), want[i]) {
			t.Fatalf("page %d differs after the layer-wise load", i)
		}
	}
	for _, ph := range []string{"turn", "pin", "plan", "start", "total"} {
		name := `orbitkv_transfer_enqueue_seconds_count{phase="` + ph + `"}`
		if got := tp.metric(name); got != name+" 1" {
			t.Errorf("enqueue histogram: %q, want one observation of phase %s", got, ph)
		}
	}
	if got := tp.metric("orbitkv_transfer_layerwise_device_seconds_count"); got != "orbitkv_transfer_layerwise_device_seconds_count 1" {
		t.Errorf("device histogram: %q, want one observation", got)
	}
}

// TestLayerwiseLoadOneAtATime: while one layer-wise load of a session is
// being enqueued, the next waits for it (never two in StartGroups at once)
// and one whose deadline passes first fails its pages; a load without
// layerwise is not held back.
func TestLayerwiseLoadOneAtATime(t *testing.T) {
	_, e, fake := layerwiseEngine(t)
	keys := randKeys(2)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	fake.enter, fake.gate = make(chan int, 4), make(chan struct{})
	type answer struct {
		h   *pb.OpHandle
		err error
	}
	first := make(chan answer, 1)
	go func() {
		h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys, 32, 4), Layerwise: true})
		first <- answer{h, err}
	}()
	<-fake.enter // the first holds the session's turn inside StartGroups
	h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys, 16, 4), Layerwise: true, DeadlineMs: 100})
	if err != nil {
		t.Fatalf("second layer-wise load: %v", err)
	}
	st, err := e.Wait(ctx(t), h.OpId)
	if err != nil || st.Pages[0].Code == pb.PageCode_PAGE_OK {
		t.Fatalf("a layer-wise load past its deadline behind another: %v %v", st, err)
	}
	okOp(t)(e.Load(ctx(t), refs(keys, 48, 4))) // whole-request loads do not queue behind it
	third := make(chan answer, 1)
	go func() {
		h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys, 16, 4), Layerwise: true})
		third <- answer{h, err}
	}()
	close(fake.gate)
	for _, c := range []chan answer{first, third} {
		a := <-c
		if a.err != nil {
			t.Fatal(a.err)
		}
		okOp(t)(e.Wait(ctx(t), a.h.OpId))
	}
	if <-fake.enter != 2 {
		t.Error("the third load was not the second to enqueue")
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if fake.mu.overlap {
		t.Error("two layer-wise loads of one session were in StartGroups at once")
	}
}

func TestLayerwiseLoadRefusedWithoutLayerEvents(t *testing.T) {
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(tinyFlash)
	keys := randKeys(1)
	_, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys, 0, 4), Layerwise: true})
	if status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("layer-wise load on a shared-memory session: %v, want FailedPrecondition", err)
	}
	resp, err := e.C.OpenSession(ctx(t), tinyFlash.OpenRequest("m", e.shm.Path))
	if err != nil || len(resp.LayerEvents) != 0 {
		t.Fatalf("shared-memory session announced layer events: %v %v", resp, err)
	}
}

func TestLayerwiseProtoRoundTrip(t *testing.T) {
	ev := [][]byte{bytes.Repeat([]byte{1}, 64), bytes.Repeat([]byte{2}, 64)}
	in := &pb.OpenSessionResponse{SessionId: "s", LayerEvents: ev}
	b, err := proto.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	var out pb.OpenSessionResponse
	if err := proto.Unmarshal(b, &out); err != nil || !proto.Equal(in, &out) {
		t.Fatalf("open session response round trip: %v %v", &out, err)
	}
	lr := &pb.LoadRequest{SessionId: "s", Layerwise: true}
	if b, err = proto.Marshal(lr); err != nil {
		t.Fatal(err)
	}
	var lo pb.LoadRequest
	if err := proto.Unmarshal(b, &lo); err != nil || !lo.Layerwise {
		t.Fatalf("load request round trip: %v %v", &lo, err)
	}
}

// TestLayerwiseGatedAnswersBeforeCopies: with gates, the Load answers once
// the layer events are armed and before any copy is enqueued; the copies
// then open each layer's gate right after that layer, in order.
func TestLayerwiseGatedAnswersBeforeCopies(t *testing.T) {
	_, e, fake := layerwiseEngine(t)
	const pages, perPage = 2, 4
	keys := randKeys(pages)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, perPage), pb.Durability_DURABILITY_DRAM))
	want := e.page(refs(keys, 0, perPage)[1].Blocks)
	fake.takeLog()
	fake.gated = true
	fake.gatedHold = make(chan struct{})
	dst := refs(keys, 32, perPage)
	h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: dst, Layerwise: true})
	if err != nil {
		t.Fatalf("gated layer-wise load: %v", err)
	}
	// Answered while StartGated is still held: only the gates are armed.
	if got := fake.takeLog(); fmt.Sprint(got) != "[gates]" {
		t.Fatalf("at the answer: %v, want only [gates]", got)
	}
	close(fake.gatedHold)
	st, err := e.Wait(ctx(t), h.OpId)
	mustOK(t, st, err)
	var wantLog []string
	for l := range layerFlash.Layers {
		for range pages {
			wantLog = append(wantLog, fmt.Sprintf("L%d", l), fmt.Sprintf("L%d", l))
		}
		wantLog = append(wantLog, fmt.Sprintf("open %d", l))
	}
	if got := fake.takeLog(); fmt.Sprint(got) != fmt.Sprint(wantLog) {
		t.Fatalf("after the answer\n %v\nwant (each layer's copies, then its gate)\n %v", got, wantLog)
	}
	if !bytes.Equal(e.page(dst[1].Blocks), want) {
		t.Fatal("page differs after the gated load")
	}
	fake.mu.Lock()
	defer fake.mu.Unlock()
	for l, w := range fake.mu.words {
		if w != 1 {
			t.Errorf("gate word %d = %d, want generation 1", l, w)
		}
	}
}

// TestLayerwiseGatedFailureReleasesEveryGate: when the copies fail after
// the Load answered, every gate is opened (the engine's stream never hangs)
// and Wait reports the pages failed.
func TestLayerwiseGatedFailureReleasesEveryGate(t *testing.T) {
	_, e, fake := layerwiseEngine(t)
	const pages, perPage = 2, 4
	keys := randKeys(pages)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, perPage), pb.Durability_DURABILITY_DRAM))
	fake.takeLog()
	fake.gated = true
	fake.failGroup = 2
	for gen := uint32(1); gen <= 2; gen++ { // twice: words reused by the next load
		h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys, 32, perPage), Layerwise: true})
		if err != nil {
			t.Fatalf("gated load: %v", err)
		}
		st, err := e.Wait(ctx(t), h.OpId)
		if err != nil {
			t.Fatal(err)
		}
		if !st.Done || len(st.Pages) != pages {
			t.Fatalf("wait: %v", st)
		}
		for i, p := range st.Pages {
			if p.Code == pb.PageCode_PAGE_OK {
				t.Errorf("load %d page %d ok after a failed gated copy", gen, i)
			}
		}
		log := fake.takeLog()
		if len(log) == 0 || log[0] != "gates" || log[len(log)-1] != "release" {
			t.Fatalf("load %d log %v: want gates first, release last", gen, log)
		}
		fake.mu.Lock()
		for l, w := range fake.mu.words {
			if w != gen {
				t.Errorf("load %d: gate word %d = %d, want %d (released)", gen, l, w, gen)
			}
		}
		fake.mu.Unlock()
	}
}

// TestGPULoadsSkipBlocks: the device planners (the batched scatterGPU and
// the layer-wise one, through fakeGPU) leave skipped blocks untouched and
// restore the others from their own blob offsets.
func TestGPULoadsSkipBlocks(t *testing.T) {
	for _, layerwise := range []bool{false, true} {
		t.Run(fmt.Sprint("layerwise=", layerwise), func(t *testing.T) {
			_, e, _ := layerwiseEngine(t)
			keys := randKeys(2)
			src := refs(keys, 0, 4)
			okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
			skip := ^uint32(0)
			dst := refs(keys, 32, 4)
			dst[0].Blocks = []uint32{skip, skip, skip, 35}
			local := e.page([]uint32{32, 33, 34})
			h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: dst, Layerwise: layerwise})
			if err != nil {
				t.Fatal(err)
			}
			st, err := e.Wait(ctx(t), h.OpId)
			mustOK(t, st, err)
			if !bytes.Equal(e.page([]uint32{32, 33, 34}), local) {
				t.Fatal("skipped blocks were overwritten")
			}
			if !bytes.Equal(e.page([]uint32{35}), e.page([]uint32{3})) {
				t.Fatal("block 35 does not hold page 0's last block")
			}
			if !bytes.Equal(e.page(dst[1].Blocks), e.page(src[1].Blocks)) {
				t.Fatal("page 1 differs after load")
			}
		})
	}
}

// TestGPUStreamedCopies: whole-request CUDA loads and DRAM saves are fed to
// the device in parts (2, 4, 8, 16, … pages) while the rest is planned;
// every page lands whole, across the part boundaries, into scattered blocks.
func TestGPUStreamedCopies(t *testing.T) {
	f := layerFlash
	f.NumBlocks = 512
	tp := startPeer(t, smallConfig(t.TempDir()))
	e := tp.engine(f)
	sess, err := tp.p.api.Engine(e.Session)
	if err != nil {
		t.Fatal(err)
	}
	sess.GPU = &fakeGPU{f: f}
	const pages, perPage = 45, 4
	r := mrand.New(mrand.NewPCG(7, 8))
	perm := r.Perm(f.NumBlocks)
	scattered := func(keys [][]byte, from int) []*pb.PageRef {
		out := refs(keys, 0, perPage)
		for i, ref := range out {
			for j := range ref.Blocks {
				ref.Blocks[j] = uint32(perm[from+i*perPage+j])
			}
		}
		return out
	}
	keys := randKeys(pages)
	src, dst := scattered(keys, 0), scattered(keys, pages*perPage)
	okOp(t)(e.Save(ctx(t), src, pb.Durability_DURABILITY_DRAM))
	okOp(t)(e.Load(ctx(t), dst))
	for i := range pages {
		if !bytes.Equal(e.page(dst[i].Blocks), e.page(src[i].Blocks)) {
			t.Fatalf("page %d differs after a streamed save and load", i)
		}
	}
	if ph := tp.p.GPUPhases(); ph.Ops["load"] == 0 || ph.Ops["save"] == 0 || ph.Phase["load"]["copy"] <= 0 {
		t.Fatalf("phase table did not count the operations: %+v", ph)
	}
}

// TestStuckGPUCopyQuarantines: a device copy that never finished
// (transfer.ErrStuck) may still write or read its memory at any time, so
// the peer fails the pages but never reuses that memory: a save's fresh
// DRAM slots stay allocated, a load's pages stay pinned (never evicted,
// their slots never reused), and the bytes show in
// orbitkv_transfer_quarantined_bytes.
func TestStuckGPUCopyQuarantines(t *testing.T) {
	for _, layerwise := range []bool{false, true} {
		t.Run(fmt.Sprint("layerwise=", layerwise), func(t *testing.T) {
			tp, e, fake := layerwiseEngine(t)
			slot := float64(dram.SlotBytes(uint64(layerFlash.Size() / layerFlash.NumBlocks * 4)))
			kept := randKeys(4)
			okOp(t)(e.Save(ctx(t), refs(kept, 0, 4), pb.Durability_DURABILITY_DRAM))
			used := tp.p.pages.PoolStats().UsedBytes
			fake.stuck = true
			st, err := e.Save(ctx(t), refs(randKeys(3), 16, 4), pb.Durability_DURABILITY_DRAM)
			if err != nil || engineclient.AllOK(st) == nil {
				t.Fatalf("save over a stuck copy: %v %v, want every page failed", st, err)
			}
			if got := tp.p.pages.PoolStats().UsedBytes; got != used+uint64(3*slot) {
				t.Fatalf("pool holds %d bytes after the stuck save, want %d: its slots must stay allocated", got, used+uint64(3*slot))
			}
			h, err := e.C.Load(ctx(t), &pb.LoadRequest{SessionId: e.Session, Pages: refs(kept, 32, 4), Layerwise: layerwise})
			if err != nil {
				t.Fatal(err)
			}
			st, err = e.Wait(ctx(t), h.OpId)
			if err != nil || engineclient.AllOK(st) == nil {
				t.Fatalf("load over a stuck copy: %v %v, want every page failed", st, err)
			}
			for i, k := range kept {
				pinned, _ := tp.p.pages.Pinned(mustKey(t, k))
				if !pinned {
					t.Fatalf("page %d was unpinned after a stuck load: its slot could be reused under the device", i)
				}
			}
			want := fmt.Sprintf("orbitkv_transfer_quarantined_bytes %g", 7*slot)
			if got := tp.metric("orbitkv_transfer_quarantined_bytes"); got != want {
				t.Fatalf("metric %q, want %q", got, want)
			}
		})
	}
}

// TestWaitingCallEndsWithItsCaller: a Load that waits runs under its
// caller's deadline (less a margin), so it answers, with its pages failed,
// before the caller stops listening, and leaves nothing running.
func TestWaitingCallEndsWithItsCaller(t *testing.T) {
	tp, e, fake := layerwiseEngine(t)
	keys := randKeys(2)
	okOp(t)(e.Save(ctx(t), refs(keys, 0, 4), pb.Durability_DURABILITY_DRAM))
	fake.hold = make(chan struct{}) // the device never finishes by itself
	defer close(fake.hold)
	short, cancel := context.WithTimeout(context.Background(), 400*time.Millisecond)
	defer cancel()
	// The client enforces its own deadline: an answer (no error) is one
	// that came before it, and pages failed by the deadline show the
	// operation ended by its own, earlier one rather than by the device.
	h, err := e.C.Load(short, &pb.LoadRequest{SessionId: e.Session, Pages: refs(keys, 32, 4), Wait: true})
	if err != nil {
		t.Fatalf("waiting load under a 400 ms caller deadline: %v (want an answer before it)", err)
	}
	if !h.Status.GetDone() || len(h.Status.GetPages()) != len(keys) {
		t.Fatalf("status %v: want done with %d pages", h.Status, len(keys))
	}
	for i, pg := range h.Status.GetPages() {
		if pg.Code != pb.PageCode_PAGE_DEADLINE {
			t.Fatalf("page %d: %v, want failed by the deadline", i, pg)
		}
	}
	if got := tp.metric("orbitkv_transfer_inflight_ops"); got != "orbitkv_transfer_inflight_ops 0" {
		t.Fatalf("%q: the operation outlived its call", got)
	}
}
