package serving

import (
	"os"
	"slices"
	"strings"
	"testing"
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
	recs, err := ReadTrace(strings.NewReader(traceLines))
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

func TestTraceMalformed(t *testing.T) {
	for _, tc := range []struct{ name, in, want string }{
		{"not json", "{\"timestamp\": 0,", "trace line 1: not a trace record"},
		{"unknown field", `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[1],"x":1}`, "unknown field"},
		{"too few ids", `{"timestamp":0,"input_length":1025,"output_length":1,"hash_ids":[1,2]}`, "needs 3 hash_ids"},
		{"zero input", `{"timestamp":0,"input_length":0,"output_length":1,"hash_ids":[]}`, "input_length 0 must be positive"},
		{"negative id", `{"timestamp":0,"input_length":5,"output_length":1,"hash_ids":[-1]}`, "hash id -1"},
		{"time goes back", "{\"timestamp\":5,\"input_length\":5,\"output_length\":1,\"hash_ids\":[1]}\n{\"timestamp\":4,\"input_length\":5,\"output_length\":1,\"hash_ids\":[1]}", "trace line 2: timestamp 4 goes back"},
		{"empty", "\n\n", "no records"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ReadTrace(strings.NewReader(tc.in))
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err %v; want %q", err, tc.want)
			}
		})
	}
}

// The shared synthetic trace parses whole, when the checkout has it.
func TestSharedSyntheticTrace(t *testing.T) {
	const path = "../../../../../shared/traces/synthetic_trace.jsonl"
	if _, err := os.Stat(path); err != nil {
		t.Skipf("no shared trace at %s", path)
	}
	recs, err := ReadTraceFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3993 {
		t.Errorf("%d records; the README says 3,993", len(recs))
	}
}
