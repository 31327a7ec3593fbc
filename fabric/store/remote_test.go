package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/transfer"
	"github.com/orbitkv/orbitkv/transfer/transporttest"
)

// fakeMembers is one member, origin 0, that holds pages and is reached
// through the transport given.
type fakeMembers struct {
	t     transfer.Transport
	pages map[pagekey.Key]catalog.RemotePage

	mu     sync.Mutex
	forgot []pagekey.Key
	notes  map[string]int
}

func (f *fakeMembers) Remote(k pagekey.Key) (catalog.RemotePage, bool) {
	p, ok := f.pages[k]
	return p, ok
}
func (f *fakeMembers) Usable(origin int) bool { return origin == 0 }
func (f *fakeMembers) Route(origin int) (transfer.Transport, string, bool) {
	return f.t, "member-0", origin == 0
}
func (f *fakeMembers) Forget(_ int, k pagekey.Key) {
	f.mu.Lock()
	f.forgot = append(f.forgot, k)
	f.mu.Unlock()
}
func (f *fakeMembers) NoteFetch(result string, _ uint64) {
	f.mu.Lock()
	f.notes[result]++
	f.mu.Unlock()
}

// remoteFixture is a store whose one member holds n pages of e's layout
// (random bytes, their true checksums) behind the faults given.
type remoteFixture struct {
	s      *Store
	e      *testEngine
	keys   []pagekey.Key
	data   [][]byte
	faulty *transporttest.Faulty
	m      *fakeMembers
}

func newRemoteFixture(t *testing.T, n int, faults transporttest.Faults) *remoteFixture {
	e := newTestEngine(t)
	mem := transporttest.NewMemory()
	fx := &remoteFixture{e: e, keys: randKeys(t, n), faulty: &transporttest.Faulty{Inner: mem, Faults: faults}}
	fx.m = &fakeMembers{t: fx.faulty, pages: map[pagekey.Key]catalog.RemotePage{}, notes: map[string]int{}}
	for _, k := range fx.keys {
		data := make([]byte, e.PageBytes)
		rand.Read(data)
		mem.Put(page.Header{Key: k, Layout: e.FP, Length: e.PageBytes, Checksum: page.Checksum(data), Generation: 1}, data)
		h, _ := catalog.HoldersOf(0)
		fx.m.pages[k] = catalog.RemotePage{Layout: e.FP, Size: e.PageBytes, Holders: h}
		fx.data = append(fx.data, data)
	}
	fx.s = testStoreWith(t, 0, fx.m)
	return fx
}

// load loads every page into blocks from 0 and returns the results.
func (fx *remoteFixture) load(ctx context.Context) ([]PageReq, []Result) {
	dst := reqs(fx.keys, 0)
	res := make([]Result, len(dst))
	fx.s.Load(ctx, fx.e.Engine, dst, res)
	return dst, res
}

// TestRemoteFetchPlacesReorderedPages: pages a member's transport completes
// out of order each land in their own DRAM slot and then their own engine
// blocks, and become this peer's.
func TestRemoteFetchPlacesReorderedPages(t *testing.T) {
	fx := newRemoteFixture(t, 8, transporttest.Faults{Reorder: true, Seed: 3})
	dst, res := fx.load(testCtx(t))
	mustAllOK(t, "load", res)
	if fx.faulty.Reordered.Load() == 0 {
		t.Fatal("the fake did not reorder")
	}
	for i, d := range dst {
		if !bytes.Equal(fx.e.page(d.Blocks), fx.data[i]) {
			t.Fatalf("page %d: engine blocks do not hold its bytes", i)
		}
		if e, ok := fx.s.cat.Get(fx.keys[i]); !ok || e.DRAMSlot < 0 {
			t.Fatalf("page %d not stored in DRAM after the fetch", i)
		}
	}
}

// TestRemoteFetchRejectsCorruptPages: bytes a transport reports fetched but
// that fail their checksum fail their page as corrupt; the page is never
// stored, its slot is freed, and the member is forgotten as its holder.
func TestRemoteFetchRejectsCorruptPages(t *testing.T) {
	odd := func(i int, _ transfer.RemoteDesc) bool { return i%2 == 1 }
	fx := newRemoteFixture(t, 6, transporttest.Faults{Corrupt: odd})
	dst, res := fx.load(testCtx(t))
	if fx.faulty.Corrupted.Load() != 3 {
		t.Fatalf("the fake corrupted %d pages, want 3", fx.faulty.Corrupted.Load())
	}
	for i := range dst {
		_, stored := fx.s.cat.Get(fx.keys[i])
		switch {
		case i%2 == 1 && (res[i].Code != CodeCorrupt || stored):
			t.Fatalf("corrupt page %d: code %d (%s), stored %v; want corrupt, not stored", i, res[i].Code, res[i].Msg, stored)
		case i%2 == 0 && (res[i].Code != CodeOK || !stored || !bytes.Equal(fx.e.page(dst[i].Blocks), fx.data[i])):
			t.Fatalf("good page %d beside corrupt ones: code %d (%s), stored %v", i, res[i].Code, res[i].Msg, stored)
		}
	}
	if got := fx.s.PoolStats().Slots; got != 3 {
		t.Fatalf("%d DRAM slots in use, want the 3 good pages'", got)
	}
	if fx.m.notes["corrupt"] != 3 || len(fx.m.forgot) != 3 {
		t.Fatalf("notes %v, forgotten %d; want 3 corrupt, 3 forgotten", fx.m.notes, len(fx.m.forgot))
	}
}

// TestRemoteFetchEndsByTheDeadline: pages a transport never completes fail
// by the operation's deadline, are not stored and give their slots back.
func TestRemoteFetchEndsByTheDeadline(t *testing.T) {
	fx := newRemoteFixture(t, 4, transporttest.Faults{Drop: transporttest.All})
	const d = 300 * time.Millisecond
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	_, res := fx.load(ctx) // returning at all is the point: a hang is the test's own timeout
	if !errors.Is(ctx.Err(), context.DeadlineExceeded) {
		t.Fatalf("load returned with its context %v: the dropped fetch must end by the deadline", ctx.Err())
	}
	for i, r := range res {
		if r.Code != CodeDeadline {
			t.Fatalf("dropped page %d: code %d (%s), want deadline", i, r.Code, r.Msg)
		}
		if _, stored := fx.s.cat.Get(fx.keys[i]); stored {
			t.Fatalf("dropped page %d stored", i)
		}
	}
	if got := fx.s.PoolStats().Slots; got != 0 {
		t.Fatalf("%d DRAM slots in use after a dropped fetch", got)
	}
}
