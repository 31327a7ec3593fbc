package serving

import (
	"github.com/orbitkv/orbitkv/internal/trace"
)

// TraceBlockTokens is the block size of the Mooncake FAST'25 trace format:
// one hash id per 512 input tokens.
const TraceBlockTokens = trace.BlockTokens

// ReadTraceFile parses a trace file with the parser `orbitkv sim` uses
// (internal/trace): unknown fields ignored, integer or float millisecond
// timestamps, records in arrival order.
func ReadTraceFile(path string) ([]trace.Record, error) { return trace.ReadFile(path) }

// Trace replays a Mooncake-format trace with synthesized tokens.
type Trace struct {
	Records      []trace.Record // in arrival order, as trace.Read returns them
	Seed         uint64
	Vocab        int
	TimeScale    float64 // multiplies arrival offsets (0.5 = twice as fast)
	MaxInput     int     // truncate prompts to this many tokens (whole blocks kept first); 0 = no limit
	OutputTokens int     // cap on output_length; 0 = the trace's own
}

// BlockTokens returns the 512 tokens of the block with hash id h: equal ids
// give equal tokens, whatever request they appear in.
func (t Trace) BlockTokens(h int) []int {
	return randomTokens(rng(t.Seed, streamBlock|uint64(h)), TraceBlockTokens, t.Vocab)
}

// Item returns request i: full blocks from their hash ids, the tail of a
// partial last block from the request index.
func (t Trace) Item(i int) Item {
	rec := t.Records[i]
	n := rec.InputLength
	if t.MaxInput > 0 && n > t.MaxInput {
		n = t.MaxInput
	}
	prompt := make([]int, 0, n)
	for _, h := range rec.HashIDs {
		if n-len(prompt) < TraceBlockTokens {
			break
		}
		prompt = append(prompt, t.BlockTokens(int(h))...)
	}
	// A partial last block, and any tokens past the last hash id, are the
	// request's own.
	if left := n - len(prompt); left > 0 {
		prompt = append(prompt, randomTokens(rng(t.Seed, streamTail|uint64(i)), left, t.Vocab)...)
	}
	out := rec.OutputLength
	if t.OutputTokens > 0 && out > t.OutputTokens {
		out = t.OutputTokens
	}
	if out < 1 {
		out = 1
	}
	scale := t.TimeScale
	if scale <= 0 {
		scale = 1
	}
	return Item{Index: i, PrefixID: -1, Prompt: prompt, MaxTokens: out,
		ArrivalMS: int64((rec.TimestampMs - t.Records[0].TimestampMs) * scale)}
}
