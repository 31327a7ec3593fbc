//go:build cgo && linux

package rdma

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/orbitkv/orbitkv/internal/page"
	"github.com/orbitkv/orbitkv/internal/pagekey"
	ibv "github.com/orbitkv/orbitkv/rdma"
	"github.com/orbitkv/orbitkv/rdma/rdmatest"
	"github.com/orbitkv/orbitkv/transfer"
	"github.com/orbitkv/orbitkv/transfer/transporttest"
)

// TestContractOverStandIn runs transfer.Transport's contract
// (transporttest.Contract) against Transport through the real cgo binding
// and rdma's STAND-IN libibverbs (rdma/testdata/standin_ibverbs.c, built
// here against the real <infiniband/verbs.h>): NOT HARDWARE. The stand-in
// copies with memcpy between registered ranges after the checks a NIC makes;
// it cannot stall, so the contract's deadline case skips. It runs in a
// child process (a process holds one libibverbs). Needs cc and
// libibverbs-dev (skips without; ORBITKV_REQUIRE=verbs-headers fails).
func TestContractOverStandIn(t *testing.T) {
	rdmatest.OverStandIn(t, func(t *testing.T) { transporttest.Contract(t, standInHarness) })
}

// standIn is the remote end of a harness: an engine with one region it
// offers for READ and WRITE, and the placements of the pages put there.
type standIn struct {
	mu     sync.Mutex
	mem    []byte
	reg    *ibv.Region
	next   uint64
	placed map[pagekey.Key]Placement
}

func (s *standIn) put(h page.Header, data []byte) transfer.RemoteKey {
	s.mu.Lock()
	defer s.mu.Unlock()
	off := s.next
	s.next += (uint64(len(data)) + 4095) &^ 4095
	copy(s.mem[off:], data)
	s.placed[h.Key] = Placement{Region: s.reg.Key, Off: off, Header: h}
	return transfer.RemoteKey{Page: h.Key, Layout: h.Layout, RKey: s.reg.Key, Addr: s.reg.Addr}
}

// Locate is what a member's answer would say: where it put the page.
func (s *standIn) Locate(_ context.Context, _ string, d transfer.RemoteDesc) (Placement, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p, ok := s.placed[d.Remote.Page]
	if !ok || p.Header.Layout != d.Remote.Layout {
		return Placement{}, fmt.Errorf("page %s: %w", d.Remote.Page, transfer.ErrRemoteNotFound)
	}
	return p, nil
}

func standInHarness(t *testing.T) transporttest.Harness {
	open := func() *ibv.Engine {
		e, err := ibv.Open(ibv.Config{GIDIndex: -1})
		if err != nil {
			t.Fatalf("open the stand-in: %v", err)
		}
		t.Cleanup(func() { e.Close() })
		return e
	}
	local, remote := open(), open()
	s := &standIn{mem: mmapT(t, 4<<20), placed: map[pagekey.Key]Placement{}}
	var err error
	if s.reg, err = remote.RegisterHost("remote", s.mem, ibv.RemoteRead|ibv.RemoteWrite); err != nil {
		t.Fatal(err)
	}
	conn, err := local.Dial(context.Background(), func(_ context.Context, info ibv.ConnInfo) (ibv.ConnInfo, error) {
		reply, _, err := remote.Accept(info)
		return reply, err
	})
	if err != nil {
		t.Fatal(err)
	}
	regs := &Registry{}
	tr := &Transport{Conn: func(string) (*ibv.Conn, error) { return conn, nil }, Locate: s, Regions: regs}
	return transporttest.Harness{Transport: tr, Endpoint: "standin", Put: s.put,
		Local: func(t *testing.T, name string, n int) *transfer.Region {
			r := transfer.HostRegion(name, mmapT(t, n))
			reg, err := local.RegisterHost(name, r.Host, ibv.LocalOnly)
			if err != nil {
				t.Fatal(err)
			}
			regs.Add(r, reg)
			return r
		}}
}

func mmapT(t *testing.T, n int) []byte {
	t.Helper()
	b, err := unix.Mmap(-1, 0, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_ANON|unix.MAP_PRIVATE)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Munmap(b) })
	return b
}
