package transfer

import (
	"context"
	"errors"
	"testing"

	"github.com/orbitkv/orbitkv/cuda"
)

type fakeGates struct {
	log   []string
	words []uint32
	arm   error
}

func (f *fakeGates) Arm(marks []*cuda.Event, gen uint32) error {
	f.log = append(f.log, "arm")
	return f.arm
}

func (f *fakeGates) Release(gen uint32) {
	f.log = append(f.log, "release")
	for l := range f.words {
		if int32(f.words[l]-gen) < 0 {
			f.words[l] = gen
		}
	}
}

func (f *fakeGates) Close() error { return nil }

// TestGateFailureReleasesEveryWord: a gated load whose copies cannot be
// enqueued (no copier before the deadline) opens every gate of its
// generation from the host, once; generations grow per load; an Arm error
// releases too.
func TestGateFailureReleasesEveryWord(t *testing.T) {
	fg := &fakeGates{words: make([]uint32, 4)}
	m := &Marks{Events: make([]*cuda.Event, 4), gates: fg}
	c := &CUDA{copiers: make(chan *copierSlot)}
	for gen := uint32(1); gen <= 2; gen++ {
		g, err := c.OpenGates(m)
		if err != nil || g == nil {
			t.Fatalf("open gates: %v %v", g, err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if _, err := c.StartGated(ctx, make([][]Desc, 4), g); err == nil {
			t.Fatal("gated start without a copier succeeded")
		}
		g.Release() // idempotent
		for l, w := range fg.words {
			if w != gen {
				t.Errorf("load %d: word %d = %d, want %d", gen, l, w, gen)
			}
		}
	}
	if want := "[arm release arm release]"; fmtLog(fg.log) != want {
		t.Fatalf("log %v, want %s", fg.log, want)
	}
	fg.arm = errors.New("arm failed")
	if _, err := c.OpenGates(m); err == nil {
		t.Fatal("arm error not returned")
	}
	if fg.words[0] != 3 {
		t.Fatalf("arm failure left word 0 = %d, want 3 (released)", fg.words[0])
	}
	if g, err := c.OpenGates(&Marks{}); g != nil || err != nil {
		t.Fatalf("ungated marks: %v %v", g, err)
	}
}

func fmtLog(l []string) string {
	s := "["
	for i, x := range l {
		if i > 0 {
			s += " "
		}
		s += x
	}
	return s + "]"
}
