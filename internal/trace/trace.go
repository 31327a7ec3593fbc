package trace

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"strings"
)

// BlockTokens is the block size of the trace's hash ids.
const BlockTokens = 512

// MaxTimestampMs bounds a timestamp so that it fits int64 nanoseconds
// (about 292 years).
const MaxTimestampMs = float64(math.MaxInt64 / 1e6)

// ErrTrace reports a malformed trace.
var ErrTrace = errors.New("malformed trace")

// maxLine bounds one trace line (a 1 M-token prompt has ~2,000 ids).
const maxLine = 16 << 20

// Record is one request of a trace.
type Record struct {
	Index        int     // position in the trace file, from 0 (blank lines not counted)
	TimestampMs  float64 // arrival, milliseconds from the trace start
	InputLength  int     // prompt, tokens
	OutputLength int     // decode length, tokens (0 when absent)
	HashIDs      []int64 // one per BlockTokens block of the prompt
}

// ArrivalMs is the arrival in whole milliseconds (truncated).
func (r Record) ArrivalMs() int64 { return int64(r.TimestampMs) }

// line is the JSON of one record; pointers tell absent from zero.
type line struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int     `json:"input_length"`
	OutputLength *int     `json:"output_length"`
	HashIDs      *[]int64 `json:"hash_ids"`
}

// ReadFile parses the trace at path (gzipped when its name ends in .gz);
// see Read.
func ReadFile(path string) ([]Record, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("open trace: %w", err)
	}
	defer f.Close()
	var r io.Reader = f
	if strings.HasSuffix(path, ".gz") {
		zr, err := gzip.NewReader(f)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		defer zr.Close()
		r = zr
	}
	recs, err := Read(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return recs, nil
}

// Read parses a JSONL trace (see the package comment for what it accepts)
// and returns its records in arrival order.
func Read(r io.Reader) ([]Record, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), maxLine)
	var recs []Record
	for n := 1; sc.Scan(); n++ {
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		rec, err := parseLine(b)
		if err != nil {
			return nil, fmt.Errorf("%w: line %d: %w", ErrTrace, n, err)
		}
		rec.Index = len(recs)
		recs = append(recs, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read trace after %d records: %w", len(recs), err)
	}
	if len(recs) == 0 {
		return nil, fmt.Errorf("%w: no records", ErrTrace)
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].TimestampMs < recs[j].TimestampMs })
	return recs, nil
}

func parseLine(b []byte) (Record, error) {
	var t line
	if err := json.Unmarshal(b, &t); err != nil {
		return Record{}, err
	}
	switch {
	case t.Timestamp == nil:
		return Record{}, errors.New("missing timestamp")
	case t.InputLength == nil:
		return Record{}, errors.New("missing input_length")
	case t.HashIDs == nil:
		return Record{}, errors.New("missing hash_ids")
	case *t.Timestamp < 0:
		return Record{}, fmt.Errorf("negative timestamp %v", *t.Timestamp)
	case *t.Timestamp >= MaxTimestampMs:
		return Record{}, fmt.Errorf("timestamp %v ms: want < %.0f", *t.Timestamp, MaxTimestampMs)
	case *t.InputLength <= 0:
		return Record{}, fmt.Errorf("input_length %d: want > 0", *t.InputLength)
	case t.OutputLength != nil && *t.OutputLength < 0:
		return Record{}, fmt.Errorf("output_length %d: want >= 0", *t.OutputLength)
	}
	for i, id := range *t.HashIDs {
		if id < 0 {
			return Record{}, fmt.Errorf("hash_ids[%d] = %d: want >= 0", i, id)
		}
	}
	rec := Record{TimestampMs: *t.Timestamp, InputLength: *t.InputLength, HashIDs: *t.HashIDs}
	if t.OutputLength != nil {
		rec.OutputLength = *t.OutputLength
	}
	return rec, nil
}
