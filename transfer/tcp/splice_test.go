package tcp

import (
	"bytes"
	"context"
	"errors"
	"net"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	"github.com/orbitkv/orbitkv/internal/pki"
)

// waitFor polls cond for up to 5 s.
func waitFor(cond func() bool) bool {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return true
		}
	}
	return cond()
}

// scribbleSource hands out a copy of each page per Open and overwrites
// the copies at release, as a pool that reuses a released slot would: a
// server that released a spliced answer before the client read it would
// deliver changed bytes.
type scribbleSource struct{ *memSource }

func (s scribbleSource) Open(ctx context.Context, wants []Want) ([]Page, func()) {
	pages, release := s.memSource.Open(ctx, wants)
	for i := range pages {
		pages[i].Data = bytes.Clone(pages[i].Data)
	}
	return pages, func() {
		for _, p := range pages {
			for j := range p.Data {
				p.Data[j] = 0xee
			}
		}
		release()
	}
}

// TestSplicedAnswersArriveWhole: with Splice, pages of every size around
// the pipe's (and missing ones between) arrive byte for byte, on a reused
// connection too, from a source that scribbles over released pages; each
// answer's pages stay leased until the client's next request, the last
// one until the client leaves.
func TestSplicedAnswersArriveWhole(t *testing.T) {
	mem := newMemSource()
	src := scribbleSource{mem}
	var wants []Want
	for i, size := range []int{1, 4095, 4096, 64<<10 + 3, splicePipeBytes, splicePipeBytes + 1, 2*splicePipeBytes + 4099} {
		wants = append(wants, src.add(uint64(i), size))
	}
	missing := Want{Key: pagekey.Key{9}, Layout: layout, Size: 10}
	ask := append(append([]Want{wants[0], missing}, wants[1:]...), missing)
	_, addr := serve(t, src, nil, func(s *Server) { s.Splice = true })
	c := NewClient(nil)
	for round := range 3 {
		dst := buffers(ask)
		errs := errsOf(c.Fetch(ctxFor(t, 5*time.Second), addr, ask, dst))
		for i, w := range ask {
			switch {
			case w == missing:
				if !errors.Is(errs[i], ErrNotFound) {
					t.Errorf("round %d page %d: %v, want not found", round, i, errs[i])
				}
			case errs[i] != nil:
				t.Errorf("round %d page %d: %v", round, i, errs[i])
			case !bytes.Equal(dst[i], src.pages[w.Key].Data):
				t.Errorf("round %d page %d (%d bytes): bytes differ", round, i, w.Size)
			}
		}
		// This answer is held; every earlier one was released when the
		// request after it arrived.
		if o, r := src.opens.Load(), src.releases.Load(); o != int64(round+1) || r != int64(round) {
			t.Errorf("after round %d: %d opens, %d releases; want %d, %d", round, o, r, round+1, round)
		}
	}
	c.Close()
	if !waitFor(func() bool { return src.releases.Load() == 3 }) {
		t.Errorf("client gone: %d releases of 3", src.releases.Load())
	}
}

// TestSpliceOverTLSWritesAsBefore: a mutual-TLS connection cannot take
// page bytes by reference, so its answers are written and released at
// once, Splice set or not.
func TestSpliceOverTLSWritesAsBefore(t *testing.T) {
	ca, err := pki.NewCA("cluster", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	member := peerTLS(t, ca)
	src := newMemSource()
	w := src.add(1, 300<<10)
	_, addr := serve(t, src, member.Server, func(s *Server) { s.Splice = true })
	c := NewClient(member.Client)
	defer c.Close()
	dst := buffers([]Want{w})
	if errs := errsOf(c.Fetch(ctxFor(t, 5*time.Second), addr, []Want{w}, dst)); errs[0] != nil || !bytes.Equal(dst[0], src.pages[w.Key].Data) {
		t.Fatalf("fetch over TLS: %v", errs[0])
	}
	if !waitFor(func() bool { return src.releases.Load() == 1 }) {
		t.Errorf("over TLS the answer was not released after its write (%d releases)", src.releases.Load())
	}
}

// TestSplicedAnswerNobodyReadsEndsAtItsDeadline: a client that asks and
// never reads leaves the spliced write to fail at the request's deadline;
// the connection is dropped (an RST, so nothing queued is sent later), the
// pages released once, and the server serves the next client.
func TestSplicedAnswerNobodyReadsEndsAtItsDeadline(t *testing.T) {
	src := newMemSource()
	w := src.add(1, 32<<20) // more than the socket buffers hold
	_, addr := serve(t, src, nil, func(s *Server) { s.Splice = true })
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	if _, err := raw.Write(appendRequest(nil, 300*time.Millisecond, []Want{w})); err != nil {
		t.Fatal(err)
	}
	if !waitFor(func() bool { return src.opens.Load() == 1 && src.releases.Load() == 1 }) {
		t.Fatalf("an unread spliced answer: %d opens, %d releases; want 1, 1", src.opens.Load(), src.releases.Load())
	}
	c := NewClient(nil)
	defer c.Close()
	small := src.add(2, 4096)
	dst := buffers([]Want{small})
	if errs := errsOf(c.Fetch(ctxFor(t, 5*time.Second), addr, []Want{small}, dst)); errs[0] != nil || !bytes.Equal(dst[0], src.pages[small.Key].Data) {
		t.Fatalf("the next client: %v", errs[0])
	}
}
