package trace

import (
	"bufio"
	"compress/gzip"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
)

func TestReadAcceptsWhatTracesCarry(t *testing.T) {
	in := `{"timestamp": 5.75, "input_length": 600, "output_length": 3, "hash_ids": [1, 2], "extra": true, "model": {"x": 1}}

{"timestamp": 0, "input_length": 10, "hash_ids": [3]}
{"timestamp": 5.75, "input_length": 20, "output_length": 0, "hash_ids": []}
`
	recs, err := Read(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 {
		t.Fatalf("%d records, want 3", len(recs))
	}
	// Arrival order, stable for the two equal timestamps; Index is file order.
	for i, want := range []struct {
		index int
		ts    float64
		in    int
		out   int
	}{{1, 0, 10, 0}, {0, 5.75, 600, 3}, {2, 5.75, 20, 0}} {
		r := recs[i]
		if r.Index != want.index || r.TimestampMs != want.ts || r.InputLength != want.in || r.OutputLength != want.out {
			t.Errorf("record %d: %+v, want %+v", i, r, want)
		}
	}
	if recs[1].ArrivalMs() != 5 {
		t.Errorf("ArrivalMs of 5.75: %d", recs[1].ArrivalMs())
	}
}

func TestReadErrorsNameTheLine(t *testing.T) {
	ok := `{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}` + "\n"
	for _, tc := range []struct{ bad, want string }{
		{`{"timestamp": 1, "input_length": 10`, "line 3: unexpected end of JSON input"},
		{`{"input_length": 10, "hash_ids": [1]}`, "line 3: missing timestamp"},
		{`{"timestamp": 1, "hash_ids": [1]}`, "line 3: missing input_length"},
		{`{"timestamp": 1, "input_length": 10}`, "line 3: missing hash_ids"},
		{`{"timestamp": 1, "input_length": 0, "hash_ids": []}`, "line 3: input_length 0"},
		{`{"timestamp": -1, "input_length": 5, "hash_ids": [1]}`, "line 3: negative timestamp"},
		{`{"timestamp": 1e13, "input_length": 5, "hash_ids": [1]}`, "line 3: timestamp 1e+13 ms"},
		{`{"timestamp": 1, "input_length": 5, "output_length": -1, "hash_ids": [1]}`, "line 3: output_length -1"},
		{`{"timestamp": 1, "input_length": 5, "hash_ids": [1, -2]}`, "line 3: hash_ids[1] = -2"},
		{`{"timestamp": 1, "input_length": 5.5, "hash_ids": [1]}`, "line 3: json: cannot unmarshal"},
		{`{"timestamp": "1", "input_length": 5, "hash_ids": [1]}`, "line 3: json: cannot unmarshal"},
		{`not json`, "line 3: invalid character"},
	} {
		_, err := Read(strings.NewReader(ok + "\n" + tc.bad + "\n" + ok))
		if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: got %v, want an ErrTrace containing %q", tc.bad, err, tc.want)
		}
	}
	if _, err := Read(strings.NewReader("\n\n")); !errors.Is(err, ErrTrace) {
		t.Errorf("empty trace: got %v, want ErrTrace", err)
	}
}

// syntheticTrace is the Mooncake FAST'25 synthetic trace (testdata/README.md).
const syntheticTrace = "testdata/synthetic_trace.jsonl.gz"

// TestSyntheticTrace parses the synthetic trace whole and checks its first
// lines field by field.
func TestSyntheticTrace(t *testing.T) {
	recs, err := ReadFile(syntheticTrace)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3993 {
		t.Errorf("%d records; the README says 3,993", len(recs))
	}
	r := recs[0]
	if r.Index != 0 || r.TimestampMs != 0 || r.InputLength != 40160 || r.OutputLength != 6 || len(r.HashIDs) != 79 || r.HashIDs[78] != 78 {
		t.Errorf("first record %+v", r)
	}
	// The same lines with float timestamps and an extra field parse alike.
	f, err := os.Open(syntheticTrace)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(zr)
	sc.Buffer(nil, maxLine)
	ts := regexp.MustCompile(`"timestamp": (\d+)`)
	var edited []string
	for i := 0; i < 3 && sc.Scan(); i++ {
		edited = append(edited, ts.ReplaceAllString(sc.Text(), `"session": "s1", "timestamp": $1.5`))
	}
	got, err := Read(strings.NewReader(strings.Join(edited, "\n")))
	if err != nil {
		t.Fatalf("float timestamps and extra fields: %v\n%s", err, strings.Join(edited, "\n"))
	}
	if got[0].TimestampMs != 0.5 || got[2].TimestampMs != 40.5 || got[2].InputLength != recs[2].InputLength {
		t.Errorf("edited lines: %+v", got)
	}
}

func FuzzRead(f *testing.F) {
	f.Add([]byte(`{"timestamp": 0, "input_length": 10, "output_length": 1, "hash_ids": [1]}`))
	f.Add([]byte(`{"timestamp": 1.5, "input_length": 600, "hash_ids": [1, 2], "x": null}` + "\n\n" + `{"timestamp": 0, "input_length": 1, "hash_ids": []}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := Read(strings.NewReader(string(b)))
		if err != nil {
			if !errors.Is(err, ErrTrace) && !strings.Contains(err.Error(), "read trace") {
				t.Fatalf("error not ErrTrace: %v", err)
			}
			return
		}
		for i, r := range recs {
			if r.TimestampMs < 0 || r.TimestampMs >= MaxTimestampMs || r.InputLength <= 0 || r.OutputLength < 0 {
				t.Fatalf("record %d breaks the invariants: %+v", i, r)
			}
			if i > 0 && r.TimestampMs < recs[i-1].TimestampMs {
				t.Fatalf("record %d out of arrival order", i)
			}
		}
	})
}
