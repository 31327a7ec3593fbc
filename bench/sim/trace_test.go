package sim

import (
	"errors"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/internal/pagekey"
)

func TestParseTrace(t *testing.T) {
	in := `{"timestamp": 5, "input_length": 600, "output_length": 3, "hash_ids": [1, 2], "extra": true}

{"timestamp": 0, "input_length": 10, "hash_ids": [3]}
`
	reqs, err := ParseTrace(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if len(reqs) != 2 || reqs[0].ArrivalMs != 0 || reqs[0].Index != 1 || reqs[1].InputTokens != 600 || reqs[1].OutputTokens != 3 {
		t.Fatalf("got %+v: want two requests sorted by arrival with their file order", reqs)
	}
}

// The parser's error cases are tested where it lives (internal/trace
// TestReadErrorsNameTheLine); here only that sim passes its errors on.
func TestParseTraceErrorIsErrTrace(t *testing.T) {
	_, err := ParseTrace(strings.NewReader(`{"timestamp": 1, "input_length": 10` + "\n"))
	if !errors.Is(err, ErrTrace) || !strings.Contains(err.Error(), "line 1") {
		t.Fatalf("got %v, want an ErrTrace naming line 1", err)
	}
}

func TestPageKeysChainOverBlocks(t *testing.T) {
	fp := Models["qwen3-8b"].Layout(64).Fingerprint()
	a := PageKeys(fp, 64, Request{Index: 0, InputTokens: 1500, HashIDs: []int64{1, 2, 3}})
	b := PageKeys(fp, 64, Request{Index: 1, InputTokens: 1500, HashIDs: []int64{1, 2, 4}})
	c := PageKeys(fp, 64, Request{Index: 2, InputTokens: 1100, HashIDs: []int64{1, 2, 3}})
	if len(a) != 23 || len(c) != 17 {
		t.Fatalf("got %d and %d pages: want 1500/64 = 23 and 1100/64 = 17", len(a), len(c))
	}
	if common(a, b) != 16 || common(a, c) != 17 {
		t.Fatalf("common prefixes %d, %d: want 16 (two shared blocks) and 17 (all of c)", common(a, b), common(a, c))
	}
	// Past the hash ids the content is the request's own.
	d := PageKeys(fp, 64, Request{Index: 3, InputTokens: 1024, HashIDs: []int64{1}})
	e := PageKeys(fp, 64, Request{Index: 4, InputTokens: 1024, HashIDs: []int64{1}})
	if common(d, e) != 8 {
		t.Fatalf("common prefix %d past the ids: want 8", common(d, e))
	}
	// Pages that straddle blocks (48 tokens does not divide 512).
	f := PageKeys(fp, 48, Request{InputTokens: 1500, HashIDs: []int64{1, 2, 3}})
	g := PageKeys(fp, 48, Request{InputTokens: 1500, HashIDs: []int64{1, 9, 3}})
	if common(f, g) != 10 { // page 10 covers tokens 480..527, across blocks 0 and 1
		t.Fatalf("48-token pages: common prefix %d, want 10", common(f, g))
	}
}

func common(a, b []pagekey.Key) int {
	n := 0
	for n < min(len(a), len(b)) && a[n] == b[n] {
		n++
	}
	return n
}

func TestRouterPick(t *testing.T) {
	cost := CostModel{PrefillUsPerToken: 1, DRAMGBps: 1, SSDGBps: 1, NetGBps: 1}
	views := []HostView{{AheadNs: 5e6, CachedTokens: 4000}, {AheadNs: 1e6}, {AheadNs: 1e6, CachedTokens: 1000}}
	for _, tc := range []struct {
		r    Router
		seq  int
		want int
	}{
		{RoundRobin, 4, 1}, {LeastLoaded, 0, 1},
		// Estimated TTFT: host 0 5 + 1 ms, host 1 1 + 5 ms, host 2 1 + 4 ms.
		{PrefixAffinity, 0, 2},
	} {
		if got := tc.r.Pick(tc.seq, 5000, views, cost); got != tc.want {
			t.Errorf("%s: picked %d, want %d", tc.r, got, tc.want)
		}
	}
	views[0].AheadNs = 3e6 // host 0: 3 + 1 ms beats host 2
	if got := PrefixAffinity.Pick(0, 5000, views, cost); got != 0 {
		t.Errorf("prefix-affinity: picked %d, want 0", got)
	}
	views[0].AheadNs = 4e6 // a tie with host 2 goes to the lower index
	if got := PrefixAffinity.Pick(0, 5000, views, cost); got != 0 {
		t.Errorf("prefix-affinity tie: picked %d, want 0", got)
	}
	if err := (Config{Router: "nearest"}).Validate(); err == nil || !strings.Contains(err.Error(), `router "nearest"`) {
		t.Errorf("unknown router: got %v", err)
	}
}

func TestCostModel(t *testing.T) {
	m := CostModel{PrefillUsPerToken: 40, DRAMGBps: 50, SSDGBps: 5, NetGBps: 20}
	if got := m.PrefillNs(1000); got != 40e6 {
		t.Errorf("prefill of 1000 tokens: %d ns, want 40 ms", got)
	}
	// 1e9 bytes: DRAM 20 ms, SSD 200 ms, remote DRAM at 20 GB/s 50 ms,
	// remote SSD at min(20, 5) = 5 GB/s 200 ms.
	if got := m.LoadNs(Load{DRAM: 1e9, SSD: 1e9, RemoteDRAM: 1e9, RemoteSSD: 1e9}); got != 470e6 {
		t.Errorf("load: %d ns, want 470 ms", got)
	}
	if got := Models["qwen3-8b"].TokenBytes() * 64; got != 9<<20 {
		t.Errorf("qwen3-8b page: %d bytes, want 9 MiB", got)
	}
}
