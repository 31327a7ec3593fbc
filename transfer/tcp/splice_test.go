package tcp

import (
	"bytes"
	"errors"
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

// TestSplicedAnswersArriveWhole: with Splice, pages of every size around
// the pipe's (and missing ones between) arrive byte for byte, on a reused
// connection too, and each answer's pages stay leased until the client's
// next request, the last one until the client leaves.
func TestSplicedAnswersArriveWhole(t *testing.T) {
	src := newMemSource()
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
