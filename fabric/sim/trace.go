package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
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
const BlockTokens = 512

// ErrTrace reports a malformed trace.
var ErrTrace = errors.New("malformed trace")

// traceLine is the JSON of one request; pointers tell absent from zero.
type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      *[]int64 `json:"hash_ids"`
}

// maxLine bounds one trace line (a 1 M-token prompt has ~2,000 ids).
const maxLine = 16 << 20

// ParseTrace reads a JSONL trace: one request per line, blank lines skipped,
// unknown fields ignored. Requests are returned in arrival order (stable for
// equal timestamps). A bad line is an error naming its line number.
func ParseTrace(r io.Reader) ([]Request, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var reqs []Request
	for n := 1; sc.Scan(); n++ {
		line := bytes.TrimSpace(sc.Bytes())
		if len(line) == 0 {
			continue
		}
		req, err := parseLine(line)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, n, err)
		}
		req.Index = len(reqs)
		reqs = append(reqs, req)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace after %d requests: %w", len(reqs), err)
	}
	if len(reqs) == 0 {
		return nil, fmt.Errorf("%w: no requests", ErrTrace)
	}
	sort.SliceStable(reqs, func(i, j int) bool { return reqs[i].ArrivalMs < reqs[j].ArrivalMs })
	return reqs, nil
}

func parseLine(line []byte) (Request, error) {
	var t traceLine
	if err := json.Unmarshal(line, &t); err != nil {
		return Request{}, err
	}
	switch {
	case t.Timestamp == nil:
		return Request{}, errors.New("missing timestamp")
	case t.InputLength == nil:
		return Request{}, errors.New("missing input_length")
	case t.HashIDs == nil:
		return Request{}, errors.New("missing hash_ids")
	case *t.Timestamp < 0:
		return Request{}, fmt.Errorf("negative timestamp %v", *t.Timestamp)
	case *t.InputLength <= 0:
		return Request{}, fmt.Errorf("input_length %d: want > 0", *t.InputLength)
	case t.OutputLength != nil && *t.OutputLength < 0:
		return Request{}, fmt.Errorf("output_length %d: want >= 0", *t.OutputLength)
	}
	for i, id := range *t.HashIDs {
		if id < 0 {
			return Request{}, fmt.Errorf("hash_ids[%d] = %d: want >= 0", i, id)
		}
	}
	req := Request{ArrivalMs: int64(*t.Timestamp), InputTokens: *t.InputLength, HashIDs: *t.HashIDs}
	if t.OutputLength != nil {
		req.OutputTokens = *t.OutputLength
	}
	return req, nil
}
