package engineapi

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/fabric/store"
	"github.com/orbitkv/orbitkv/internal/engineclient"
	"github.com/orbitkv/orbitkv/internal/pagekey"
)

var tinyFlash = engineclient.Flash{Layers: 2, NumBlocks: 64, BlockTokens: 4, PageTokens: 16, KVHeads: 2, HeadDim: 16, ElemBytes: 4}

// TestCheckLoadLease: a Load's lease must be live at the load's time, held
// by a session of the loading session's model (its layout up to the TP
// rank: the scheduler's lookup-only session takes the leases its workers
// load with); an expired lease not yet reaped is not found, and says so.
func TestCheckLoadLease(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	layout := pagekey.Layout{Model: "m", DType: "fp32", NumLayers: 2, KVHeads: 2, HeadDim: 16, TPSize: 2, PageTokens: 16, ByteLayout: "vllm-flash"}
	newSession := func(id string, l pagekey.Layout) *session {
		s := &session{id: id}
		s.Layout, s.FP = l, l.Fingerprint()
		s.mu.leases = map[string]*lease{}
		return s
	}
	worker := layout
	worker.TPRank = 1
	other := layout
	other.Model = "n"
	sched, w, o := newSession("s-sched", layout), newSession("s-worker", worker), newSession("s-other", other)
	sched.mu.leases["l-1"] = &lease{id: "l-1", expires: t0.Add(time.Second)}
	p := &API{sessions: newSessions()}
	for _, s := range []*session{sched, w, o} {
		p.sessions.add(s)
	}
	for _, tc := range []struct {
		name  string
		sess  *session
		id    string
		at    time.Time
		want  error
		wants string
	}{
		{"no lease", w, "", t0, nil, ""},
		{"the scheduler's, from a worker of its model", w, "l-1", t0, nil, ""},
		{"at its expiry", w, "l-1", t0.Add(time.Second), nil, ""},
		{"expired, not yet reaped", w, "l-1", t0.Add(time.Second + time.Millisecond), store.ErrNotFound, "expired"},
		{"another model's", o, "l-1", t0, errLayoutMismatch, "model"},
		{"unknown", w, "l-2", t0, store.ErrNotFound, "unknown"},
	} {
		err := p.checkLoadLease(tc.sess, tc.id, tc.at)
		if !errors.Is(err, tc.want) || tc.want == nil && err != nil || !strings.Contains(errString(err), tc.wants) {
			t.Errorf("%s: %v, want %v (%q)", tc.name, err, tc.want, tc.wants)
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}
