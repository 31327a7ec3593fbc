package serving

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/bench/sim"
	"github.com/orbitkv/orbitkv/internal/trace"
)

func TestSustainedIsAFunctionOfSeedAndIndex(t *testing.T) {
	w := Sustained{Seed: 7, Prefixes: 12, PrefixTokens: []int{128, 256, 512}, Reuse: 0.75, OutputTokens: 16, Vocab: 512}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	reused := 0
	for i := range 400 {
		a, b := w.Item(i), w.Item(i)
		if !slices.Equal(a.Prompt, b.Prompt) || a.PrefixID != b.PrefixID {
			t.Fatalf("item %d differs between calls", i)
		}
		if a.Reuse {
			reused++
			if !slices.Equal(a.Prompt, w.Prefix(a.PrefixID)) {
				t.Fatalf("item %d reuses prefix %d but its prompt is not that prefix", i, a.PrefixID)
			}
		}
		for _, tok := range a.Prompt {
			if tok < 0 || tok >= w.Vocab {
				t.Fatalf("token %d outside the vocabulary", tok)
			}
		}
	}
	if reused < 260 || reused > 340 {
		t.Errorf("%d of 400 reused; want about 300 at reuse 0.75", reused)
	}
	for j := range 12 {
		if n := len(w.Prefix(j)); n != w.PrefixTokens[j%3] {
			t.Errorf("prefix %d has %d tokens; lengths alternate 128/256/512", j, n)
		}
	}
	other := w
	other.Seed = 8
	if slices.Equal(w.Prefix(0), other.Prefix(0)) {
		t.Error("a different seed gave the same prefix")
	}
	// Later items do not depend on earlier ones: item 5 alone equals item 5 in sequence.
	if !slices.Equal(Sustained(w).Item(5).Prompt, w.Item(5).Prompt) {
		t.Error("item 5 depends on evaluation order")
	}
}

const traceLines = `{"timestamp": 0, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2]}
{"timestamp": 10, "input_length": 1024, "output_length": 3, "hash_ids": [0, 1]}

{"timestamp": 25, "input_length": 1300, "output_length": 0, "hash_ids": [0, 1, 9]}
`

func TestTraceEqualHashIDsGiveEqualTokens(t *testing.T) {
	recs, err := trace.Read(strings.NewReader(traceLines))
	if err != nil {
		t.Fatal(err)
	}
	tr := Trace{Records: recs, Seed: 3, Vocab: 512, TimeScale: 0.5, OutputTokens: 4}
	a, b, c := tr.Item(0), tr.Item(1), tr.Item(2)
	if len(a.Prompt) != 1100 || len(b.Prompt) != 1024 || len(c.Prompt) != 1300 {
		t.Fatalf("prompt lengths %d %d %d", len(a.Prompt), len(b.Prompt), len(c.Prompt))
	}
	if !slices.Equal(a.Prompt[:1024], b.Prompt) || !slices.Equal(a.Prompt[:1024], c.Prompt[:1024]) {
		t.Error("hash ids 0,1 at equal positions gave different tokens")
	}
	if slices.Equal(a.Prompt[1024:1100], c.Prompt[1024:1100]) {
		t.Error("partial last blocks of different requests share tokens; the tail comes from the request index")
	}
	if a.MaxTokens != 4 || b.MaxTokens != 3 || c.MaxTokens != 1 {
		t.Errorf("output tokens %d %d %d; want the trace's capped at 4, at least 1", a.MaxTokens, b.MaxTokens, c.MaxTokens)
	}
	if b.ArrivalMS != 5 || c.ArrivalMS != 12 {
		t.Errorf("arrivals %d %d; want timestamps × 0.5", b.ArrivalMS, c.ArrivalMS)
	}
	tr.MaxInput = 600
	if p := tr.Item(0).Prompt; len(p) != 600 || !slices.Equal(p[:512], b.Prompt[:512]) {
		t.Error("--max-input did not keep whole leading blocks")
	}
	if !slices.Equal(tr.BlockTokens(1), a.Prompt[512:1024]) {
		t.Error("BlockTokens disagrees with the prompt")
	}
}

// TestTraceAcceptsWhatSimAccepts: bench serving reads a trace with the
// parser orbitkv sim uses, so float timestamps, extra fields, a missing
// output_length and out-of-order lines are read alike by both.
func TestTraceAcceptsWhatSimAccepts(t *testing.T) {
	in := `{"timestamp": 12.5, "input_length": 1100, "output_length": 6, "hash_ids": [0, 1, 2], "session_id": "a"}
{"timestamp": 2.25, "input_length": 1024, "hash_ids": [0, 1]}
{"timestamp": 30, "input_length": 1300, "output_length": 2, "hash_ids": [0]}
`
	path := filepath.Join(t.TempDir(), "t.jsonl")
	if err := os.WriteFile(path, []byte(in), 0o644); err != nil {
		t.Fatal(err)
	}
	recs, err := ReadTraceFile(path)
	if err != nil {
		t.Fatal(err)
	}
	reqs, err := sim.ParseTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != len(reqs) {
		t.Fatalf("serving read %d records, sim %d", len(recs), len(reqs))
	}
	for i, r := range recs {
		q := reqs[i]
		if r.Index != q.Index || r.ArrivalMs() != q.ArrivalMs || r.InputLength != q.InputTokens || r.OutputLength != q.OutputTokens {
			t.Errorf("record %d: serving %+v, sim %+v", i, r, q)
		}
	}
	tr := Trace{Records: recs, Seed: 3, Vocab: 512, TimeScale: 2}
	a, b, c := tr.Item(0), tr.Item(1), tr.Item(2)
	if a.ArrivalMS != 0 || b.ArrivalMS != 20 || c.ArrivalMS != 55 {
		t.Errorf("arrivals %d %d %d; want (t - 2.25) × 2 = 0, 20, 55", a.ArrivalMS, b.ArrivalMS, c.ArrivalMS)
	}
	// Fewer hash ids than blocks: the prompt still has input_length tokens,
	// the ids' blocks first.
	if len(c.Prompt) != 1300 || !slices.Equal(c.Prompt[:512], a.Prompt[:512]) || slices.Equal(c.Prompt[512:1024], b.Prompt[512:1024]) {
		t.Errorf("one id for 1,300 tokens: %d tokens, block 0 shared %v", len(c.Prompt), slices.Equal(c.Prompt[:512], a.Prompt[:512]))
	}
}

func TestTraceMalformed(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not json", "{\"timestamp\": 0,", "line 1: unexpected end of JSON input"},
		{"zero input", `{"timestamp":0,"input_length":0,"output_length":1,"hash_ids":[]}`, "input_length 0"},
		{"negative id", `{"timestamp":0,"input_length":5,"output_length":1,"hash_ids":[-1]}`, "hash_ids[0] = -1"},
		{"empty", "\n\n", "no records"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "t.jsonl")
			if err := os.WriteFile(path, []byte(tc.in), 0o644); err != nil {
				t.Fatal(err)
			}
			_, err := ReadTraceFile(path)
			if !errors.Is(err, trace.ErrTrace) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want an ErrTrace with %q", err, tc.want)
			}
		})
	}
}
