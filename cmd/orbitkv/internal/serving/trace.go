package serving

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
)

// TraceBlockTokens is the block size of the Mooncake FAST'25 trace format:
// one hash id per 512 input tokens.
const TraceBlockTokens = 512

// TraceRecord is one line of a Mooncake-format trace.
type TraceRecord struct {
	Timestamp    int64 `json:"timestamp"`     // arrival, ms from the trace start
	InputLength  int   `json:"input_length"`  // tokens
	OutputLength int   `json:"output_length"` // tokens
	HashIDs      []int `json:"hash_ids"`      // one per 512-token block of the input
}

// ReadTraceFile parses a trace file; see ReadTrace.
func ReadTraceFile(path string) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	recs, err := ReadTrace(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// ReadTrace parses a JSON-lines trace. A malformed line is an error naming
// the line; blank lines are skipped.
func ReadTrace(r io.Reader) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 64<<20)
	var out []TraceRecord
	for line := 1; sc.Scan(); line++ {
		b := sc.Bytes()
		if len(bytes.TrimSpace(b)) == 0 {
			continue
		}
		var rec TraceRecord
		dec := json.NewDecoder(bytes.NewReader(b))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("trace line %d: not a trace record: %v", line, err)
		}
		if err := rec.validate(); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if n := len(out); n > 0 && rec.Timestamp < out[n-1].Timestamp {
			return nil, fmt.Errorf("trace line %d: timestamp %d goes back (previous %d)", line, rec.Timestamp, out[n-1].Timestamp)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("trace has no records")
	}
	return out, nil
}

func (r TraceRecord) validate() error {
	switch {
	case r.Timestamp < 0:
		return fmt.Errorf("timestamp %d is negative", r.Timestamp)
	case r.InputLength <= 0:
		return fmt.Errorf("input_length %d must be positive", r.InputLength)
	case r.OutputLength < 0:
		return fmt.Errorf("output_length %d is negative", r.OutputLength)
	}
	want := (r.InputLength + TraceBlockTokens - 1) / TraceBlockTokens
	if len(r.HashIDs) != want {
		return fmt.Errorf("input_length %d needs %d hash_ids (one per %d tokens), got %d",
			r.InputLength, want, TraceBlockTokens, len(r.HashIDs))
	}
	for _, h := range r.HashIDs {
		if h < 0 {
			return fmt.Errorf("hash id %d is negative", h)
		}
	}
	return nil
}

// Trace replays a Mooncake-format trace with synthesized tokens.
type Trace struct {
	Records      []TraceRecord
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
		left := n - len(prompt)
		if left <= 0 {
			break
		}
		if left >= TraceBlockTokens {
			prompt = append(prompt, t.BlockTokens(h)...)
			continue
		}
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
		ArrivalMS: int64(float64(rec.Timestamp-t.Records[0].Timestamp) * scale)}
}
