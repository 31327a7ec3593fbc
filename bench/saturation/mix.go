package saturation

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"time"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// satStep is one step of a stream: save prompt fresh (an id no step had
// before), then revisit prompt revisit (-1: none), one whose save finished.
type satStep struct{ fresh, revisit int64 }

// satMix hands out the streams' steps. Every step saves a new prompt; with
// probability reuse it also revisits one picked uniformly among the last
// window prompts whose saves finished (none yet: no revisit). Safe for
// concurrent use; the randomness is the caller's (one seeded source per
// stream).
type satMix struct {
	reuse  float64
	window int
	mu     struct {
		sync.Mutex
		next int64
		done []int64 // ring of the last window prompts saved
		head int     // where the next one goes once the ring is full
	}
}

func newSatMix(reuse float64, window int) *satMix {
	return &satMix{reuse: reuse, window: max(1, window)}
}

func (m *satMix) step(rng *rand.Rand) satStep {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := satStep{fresh: m.mu.next, revisit: -1}
	m.mu.next++
	if len(m.mu.done) > 0 && rng.Float64() < m.reuse {
		s.revisit = m.mu.done[rng.IntN(len(m.mu.done))]
	}
	return s
}

// saved makes prompt id revisitable, pushing out the oldest of the window.
func (m *satMix) saved(id int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if len(m.mu.done) < m.window {
		m.mu.done = append(m.mu.done, id)
		return
	}
	m.mu.done[m.mu.head] = id
	m.mu.head = (m.mu.head + 1) % m.window
}

// satKey is page j of prompt id: the run's tag, the prompt and the page.
func satKey(id int64, j int) []byte {
	k := make([]byte, 16)
	copy(k, "sat:")
	binary.BigEndian.PutUint64(k[4:], uint64(id))
	binary.BigEndian.PutUint32(k[12:], uint32(j))
	return k
}

// The engine buffer: per stream, batch staging pages it saves from and
// batch pages it loads into. Page j of every prompt holds the same bytes
// (stream 0's staging page j, the reference) but for its key in the first
// satStamp bytes, so every page's bytes are its key's alone: a save of the
// same page by another stream gives the same bytes (a readmission attaches
// instead of replacing, as with a deterministic engine), and a load that
// brought another page's bytes is caught.
const satStamp = 16

func (d *satDriver) stagingBlock(st, j int) int { return (st*d.b.batch + j) * d.per }
func (d *satDriver) loadBlock(st, j int) int {
	return ((d.b.streams+st)*d.b.batch + j) * d.per
}

// run is the bytes of page first's blocks in segment (layer, plane).
func (d *satDriver) run(layer, plane, first int) []byte {
	f := d.b.flash
	at := f.BlockOffset(layer, plane, first)
	return d.be.Shm.Mem[at : at+d.per*f.BlockBytes()]
}

// fill writes the reference pages from seed and copies them to every
// stream's staging pages.
func (d *satDriver) fill(seed uint64) {
	rng := rand.New(rand.NewPCG(seed, 0x5a7))
	for l := range d.b.flash.Layers {
		for p := range 2 {
			for j := range d.b.batch {
				ref := d.run(l, p, d.stagingBlock(0, j))
				for i := 0; i+8 <= len(ref); i += 8 {
					binary.LittleEndian.PutUint64(ref[i:], rng.Uint64())
				}
				for st := 1; st < d.b.streams; st++ {
					copy(d.run(l, p, d.stagingBlock(st, j)), ref)
				}
			}
		}
	}
}

// refs names pages [0, n) of prompt id in the stream's staging (load:
// false) or load pages.
func (d *satDriver) refs(st int, id int64, n int, load bool) []*pb.PageRef {
	out := make([]*pb.PageRef, n)
	for j := range n {
		first := d.stagingBlock(st, j)
		if load {
			first = d.loadBlock(st, j)
		}
		out[j] = &pb.PageRef{Key: satKey(id, j)}
		for b := range d.per {
			out[j].Blocks = append(out[j].Blocks, uint32(first+b))
		}
	}
	return out
}

// save stamps the stream's staging pages with prompt id's keys and saves
// them as a cache fill (acknowledged in DRAM, as vLLM's saves are).
func (d *satDriver) save(ctx context.Context, st int, id int64, t *satSaves) error {
	refs := d.refs(st, id, d.b.batch, false)
	for j, r := range refs {
		copy(d.run(0, 0, d.stagingBlock(st, j)), r.Key)
	}
	t0 := time.Now()
	res, err := d.be.E.Save(ctx, refs, pb.Durability_DURABILITY_DRAM)
	if err != nil {
		return fmt.Errorf("save: %w", err)
	}
	t.lat = append(t.lat, time.Since(t0))
	t.pages.add(res.Pages)
	return nil
}

// load looks up the first half of prompt id with a lease, loads the hit
// pages into the stream's load pages (ending the lease) and checks every
// page loaded against its key's bytes.
func (d *satDriver) load(ctx context.Context, st int, id int64, t *satTally) error {
	n := (d.b.batch + 1) / 2
	keys := make([][]byte, n)
	for j := range keys {
		keys[j] = satKey(id, j)
	}
	lk, err := d.be.E.Lookup(ctx, keys, true)
	if err != nil {
		return fmt.Errorf("lookup: %w", err)
	}
	t.lookups++
	t.asked += n
	t.hit += int(lk.HitPages)
	if lk.HitPages == 0 {
		return nil
	}
	t0 := time.Now()
	h, err := d.be.E.C.Load(ctx, &pb.LoadRequest{SessionId: d.be.E.Session, LeaseId: lk.LeaseId,
		Pages: d.refs(st, id, int(lk.HitPages), true), Wait: true, EndLease: true})
	if err != nil {
		return fmt.Errorf("load: %w", err)
	}
	res := h.Status
	if !res.GetDone() {
		if res, err = d.be.E.Wait(ctx, h.OpId); err != nil {
			return fmt.Errorf("load: %w", err)
		}
	}
	t.load.lat = append(t.load.lat, time.Since(t0))
	t.load.pages.add(res.Pages)
	for j, p := range res.Pages {
		if p.Code != pb.PageCode_PAGE_OK {
			continue
		}
		if err := d.check(st, j, keys[j]); err != nil {
			return err
		}
		t.checked++
	}
	return nil
}

// check compares load page j of the stream with the bytes saved for key:
// the reference page j with the key in its stamp.
func (d *satDriver) check(st, j int, key []byte) error {
	for l := range d.b.flash.Layers {
		for p := range 2 {
			got, want := d.run(l, p, d.loadBlock(st, j)), d.run(l, p, d.stagingBlock(0, j))
			from := 0
			if l == 0 && p == 0 {
				if !bytes.Equal(got[:satStamp], key) {
					return fmt.Errorf("page %x loaded with the bytes of page %x", key, got[:satStamp])
				}
				from = satStamp
			}
			if !bytes.Equal(got[from:], want[from:]) {
				return fmt.Errorf("page %x loaded with other bytes (layer %d, plane %d)", key, l, p)
			}
		}
	}
	return nil
}

// satOutcomes counts pages by result: "ok dram", "ok ssd", or the code and
// message of a page not done.
type satOutcomes map[string]int

func (o satOutcomes) add(pages []*pb.PageResult) {
	for _, p := range pages {
		o[outcome(p)]++
	}
}

func outcome(p *pb.PageResult) string {
	code := strings.ToLower(strings.TrimPrefix(p.Code.String(), "PAGE_"))
	if p.Code == pb.PageCode_PAGE_OK {
		return code + " " + strings.ToLower(strings.TrimPrefix(p.Tier.String(), "TIER_"))
	}
	if p.Message != "" {
		return code + ": " + p.Message
	}
	return code
}

// ok is how many pages succeeded.
func (o satOutcomes) ok() int {
	n := 0
	for k, v := range o {
		if strings.HasPrefix(k, "ok") {
			n += v
		}
	}
	return n
}

// failed lists the outcomes other than ok, sorted.
func (o satOutcomes) failed() []string {
	var out []string
	for k := range o {
		if !strings.HasPrefix(k, "ok") {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

// satSaves is one kind of request's latencies and page outcomes.
type satSaves struct {
	lat   []time.Duration
	pages satOutcomes
}

// satTally is what a stream saw.
type satTally struct {
	save, resave, load satSaves
	lookups, asked     int // lookups, pages they asked about
	hit                int // pages they found
	checked            int // loaded pages compared byte for byte (all equal: a difference ends the run)
}

func newSatTally() satTally {
	return satTally{save: satSaves{pages: satOutcomes{}}, resave: satSaves{pages: satOutcomes{}}, load: satSaves{pages: satOutcomes{}}}
}

func (t *satTally) merge(o satTally) {
	for _, p := range []struct{ to, from *satSaves }{{&t.save, &o.save}, {&t.resave, &o.resave}, {&t.load, &o.load}} {
		p.to.lat = append(p.to.lat, p.from.lat...)
		for k, v := range p.from.pages {
			p.to.pages[k] += v
		}
	}
	t.lookups, t.asked, t.hit, t.checked = t.lookups+o.lookups, t.asked+o.asked, t.hit+o.hit, t.checked+o.checked
}
