package serving

import (
	"fmt"
	"math/rand/v2"
)

// Item is one request of a workload: what to send and how to label it.
type Item struct {
	Index     int    // request index within the measured window
	PrefixID  int    // prepared prefix reused, or -1 for a new prompt
	Reuse     bool   // the prompt is a prepared prefix (its output has a reference)
	Prompt    []int  // token ids
	MaxTokens int    // output tokens asked for
	Phase     string // probes: cold, resident, evicted, restart, filler; "" otherwise
	ArrivalMS int64  // trace: arrival offset in ms after scaling; 0 otherwise
}

// Sustained is the seeds' mixed-prefix workload: a set of prepared prefixes
// and a request sequence that reuses one with probability Reuse, else sends a
// new random prompt. It is a pure function of its fields.
type Sustained struct {
	Seed         uint64
	Prefixes     int     // prepared prefixes
	PrefixTokens []int   // lengths, cycled over prefixes and new prompts
	Reuse        float64 // probability that a request reuses a prepared prefix
	OutputTokens int
	Vocab        int // token ids lie in [0, Vocab)
}

// Validate reports a workload that cannot produce requests.
func (w Sustained) Validate() error {
	switch {
	case w.Prefixes <= 0:
		return fmt.Errorf("sustained: --prefixes must be positive, got %d", w.Prefixes)
	case len(w.PrefixTokens) == 0:
		return fmt.Errorf("sustained: --prefix-tokens is empty")
	case w.Reuse < 0 || w.Reuse > 1:
		return fmt.Errorf("sustained: --reuse %g not in [0, 1]", w.Reuse)
	case w.OutputTokens <= 0:
		return fmt.Errorf("sustained: --output-tokens must be positive")
	case w.Vocab < 2:
		return fmt.Errorf("sustained: --vocab must be at least 2")
	}
	for _, n := range w.PrefixTokens {
		if n <= 0 {
			return fmt.Errorf("sustained: prefix length %d must be positive", n)
		}
	}
	return nil
}

// Stream tags keep the random streams of prefixes, requests and trace blocks
// apart, so that changing one never shifts another.
const (
	streamPrefix  = 0x5052_4546 << 32 // "PREF"
	streamRequest = 0x5245_5155 << 32 // "REQU"
	streamBlock   = 0x424c_4f43 << 32 // "BLOC"
	streamTail    = 0x5441_494c << 32 // "TAIL"
)

func rng(seed, stream uint64) *rand.Rand { return rand.New(rand.NewPCG(seed, stream)) }

// randomTokens draws n token ids in [0, vocab) from r.
func randomTokens(r *rand.Rand, n, vocab int) []int {
	out := make([]int, n)
	for i := range out {
		out[i] = r.IntN(vocab)
	}
	return out
}

// Prefix returns prepared prefix j.
func (w Sustained) Prefix(j int) []int {
	n := w.PrefixTokens[j%len(w.PrefixTokens)]
	return randomTokens(rng(w.Seed, streamPrefix|uint64(j)), n, w.Vocab)
}

// Item returns request i of the measured sequence.
func (w Sustained) Item(i int) Item {
	r := rng(w.Seed, streamRequest|uint64(i))
	it := Item{Index: i, PrefixID: -1, MaxTokens: w.OutputTokens}
	if r.Float64() < w.Reuse {
		it.PrefixID = r.IntN(w.Prefixes)
		it.Reuse = true
		it.Prompt = w.Prefix(it.PrefixID)
		return it
	}
	n := w.PrefixTokens[r.IntN(len(w.PrefixTokens))]
	it.Prompt = randomTokens(r, n, w.Vocab)
	return it
}
