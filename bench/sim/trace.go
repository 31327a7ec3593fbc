package sim

import (
	"io"

	"github.com/orbitkv/orbitkv/internal/trace"
)

// Request is one line of a trace.
type Request struct {
	Index        int     // position in the trace file, from 0
	ArrivalMs    int64   // milliseconds from the start of the trace
	InputTokens  int     // prompt length in tokens
	OutputTokens int     // decode length in tokens (not modeled)
	HashIDs      []int64 // one id per BlockTokens block of the prompt
}

// BlockTokens is the block size of the trace's hash ids.
const BlockTokens = trace.BlockTokens

// ErrTrace reports a malformed trace.
var ErrTrace = trace.ErrTrace

// ParseTrace reads a JSONL trace with the one parser `bench serving
// --workload trace` uses too (internal/trace: blank lines skipped, unknown
// fields ignored, integer or float millisecond timestamps). Requests are
// returned in arrival order (stable for equal timestamps). A bad line is an
// ErrTrace naming its line number.
func ParseTrace(r io.Reader) ([]Request, error) {
	recs, err := trace.Read(r)
	if err != nil {
		return nil, err
	}
	reqs := make([]Request, len(recs))
	for i, rec := range recs {
		reqs[i] = Request{Index: rec.Index, ArrivalMs: rec.ArrivalMs(), InputTokens: rec.InputLength,
			OutputTokens: rec.OutputLength, HashIDs: rec.HashIDs}
	}
	return reqs, nil
}
