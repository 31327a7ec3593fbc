package sim

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"strings"
	"testing"
)

// tinyConfig is one host, no HBM cache, 16 bytes of KV per token (1 KiB
// pages of 64 tokens), 1 µs per token and 1 GB/s on every path.
func tinyConfig() Config {
	cfg := DefaultConfig()
	cfg.Model = Model{Name: "tiny", Layers: 1, KVHeads: 1, HeadDim: 4, DTypeSize: 2, DType: "bfloat16"} // 16 B/token
	cfg.HBMTokens = 0
	cfg.DRAMBytes, cfg.SSDBytes = 1<<20, 1<<20
	cfg.Cost = CostModel{PrefillUsPerToken: 1, DRAMGBps: 1, SSDGBps: 1, NetGBps: 1}
	return cfg
}

func run(t *testing.T, cfg Config, trace string) *Result {
	t.Helper()
	reqs, err := ParseTrace(strings.NewReader(trace))
	if err != nil {
		t.Fatal(err)
	}
	res, err := Run(cfg, reqs)
	if err != nil {
		t.Fatal(err)
	}
	checkAccounting(t, cfg, res)
	return res
}

// checkAccounting: every input token is a hit in one tier or a miss, and the
// bytes loaded per path are the hit pages of that path.
func checkAccounting(t *testing.T, cfg Config, r *Result) {
	t.Helper()
	tk := r.Tokens
	if tk.HBM+tk.DRAM+tk.SSD+tk.Remote+tk.Miss != tk.Input {
		t.Errorf("hits %d+%d+%d+%d + miss %d != input %d", tk.HBM, tk.DRAM, tk.SSD, tk.Remote, tk.Miss, tk.Input)
	}
	perToken := cfg.PageBytes() / uint64(cfg.PageTokens)
	b := r.Bytes
	if b.HBMFromDRAM != uint64(tk.DRAM)*perToken || b.HBMFromSSD != uint64(tk.SSD)*perToken || b.RemoteToLocal != uint64(tk.Remote)*perToken {
		t.Errorf("bytes %+v do not match hit tokens %+v", b, tk)
	}
	if b.DRAMToSSD != uint64(r.DemotedPages)*cfg.PageBytes() {
		t.Errorf("demoted bytes %d != %d pages", b.DRAMToSSD, r.DemotedPages)
	}
	h := r.HitRate
	if sum := h.HBM + h.DRAM + h.SSD + h.Remote + h.Miss; sum < 0.999999 || sum > 1.000001 {
		t.Errorf("hit rates sum to %v", sum)
	}
	if r.Prefill.ComputedS+r.Prefill.SavedS-r.Prefill.NoCacheS > 1e-9 {
		t.Errorf("prefill %+v does not add up", r.Prefill)
	}
}

func line(ms int64, input int, ids ...int) string {
	s := make([]string, len(ids))
	for i, id := range ids {
		s[i] = fmt.Sprint(id)
	}
	return fmt.Sprintf(`{"timestamp": %d, "input_length": %d, "output_length": 1, "hash_ids": [%s]}`+"\n", ms, input, strings.Join(s, ", "))
}

func TestFullyCachedPromptStillComputesItsLastToken(t *testing.T) {
	// 1,024 tokens are 16 whole pages, but an engine computes at least the
	// last prompt token, so a hit stops at (1024-1)/64 = 15 pages, as the
	// connector asks; 64 tokens (one page) can hit nothing.
	for _, hbm := range []int64{0, 1 << 20} {
		cfg := tinyConfig()
		cfg.HBMTokens = hbm
		r := run(t, cfg, line(0, 1024, 1, 2)+line(100, 1024, 1, 2)+line(200, 64, 3)+line(300, 64, 3))
		if hit := r.Tokens.HBM + r.Tokens.DRAM; hit != 960 || r.Tokens.Miss != 1024+64+64+64 {
			t.Errorf("hbm %d: tokens %+v: want 960 hit (15 pages) and 1216 missed", hbm, r.Tokens)
		}
	}
}

func TestSecondIdenticalRequestHitsEverything(t *testing.T) {
	// 1,000 tokens: 15 whole pages (960 tokens) and a 40-token tail.
	trace := line(0, 1000, 1, 2) + line(100, 1000, 1, 2)
	r := run(t, tinyConfig(), trace)
	if r.Tokens.DRAM != 960 || r.Tokens.Miss != 1000+40 {
		t.Fatalf("tokens %+v: want 960 DRAM hits and 1040 missed", r.Tokens)
	}
	// With the HBM prefix cache on, the engine itself holds the pages.
	cfg := tinyConfig()
	cfg.HBMTokens = 1 << 20
	if r := run(t, cfg, trace); r.Tokens.HBM != 960 || r.Tokens.DRAM != 0 {
		t.Fatalf("tokens %+v: want 960 HBM hits", r.Tokens)
	}
	// TTFT: the first computes 1,000 tokens at 1 µs; the second loads 960
	// tokens × 16 B at 1 GB/s (15,360 ns) and computes 40 tokens.
	if r.TTFTms.Max != 1.0 || r.TTFTms.P50 != 0.05536 {
		t.Fatalf("ttft %+v: want 1 ms and 0.05536 ms", r.TTFTms)
	}
}

func TestEvictionWithOnePageOfDRAM(t *testing.T) {
	cfg := tinyConfig()
	cfg.DRAMBytes, cfg.SSDBytes = cfg.PageBytes(), 0
	trace := line(0, 129, 7) + line(100, 129, 7) // two whole pages and a token each
	r := run(t, cfg, trace)
	// First save: p0 in, p1 evicts p0. The second request finds p0 gone
	// (its p1 is unreachable: head-first eviction orphans the chain), then
	// saves p0 (evicting p1) and p1 (evicting p0).
	if r.Tokens.DRAM != 0 || r.EvictedPages.DRAM != 3 || r.DemotedPages != 0 {
		t.Fatalf("got %+v: want no hits and 3 DRAM evictions", r.Counters)
	}

	// With one page of SSD too, the evicted page is demoted and both hit.
	cfg.SSDBytes = cfg.PageBytes()
	r = run(t, cfg, trace)
	// Request 1 saves p0, then p1 demotes p0: DRAM {p1}, SSD {p0}.
	// Request 2 hits p0 on SSD and p1 in DRAM, then saves: p0's promotion
	// demotes p1, whose SSD room drops p0 (SSD-only, so it leaves the
	// catalog, and p0 is re-saved from its read buffer): DRAM {p0}, SSD {p1}.
	// p1, now on SSD only and not read from there, is a readmission: the
	// pool holds only p0, fresh, so no slot is free of a write (and no clean
	// copy to judge p1 against), and p1 stays on SSD, as in the peer
	// (fabric/store/evict.go, allocReadmit; readmit.go, admitsReadmit).
	want := Counters{
		Tokens:       TokenCounts{Input: 258, DRAM: 64, SSD: 64, Miss: 130},
		Bytes:        ByteCounts{HBMFromDRAM: 1024, HBMFromSSD: 1024, HBMToDRAM: 2048, DRAMToSSD: 2048},
		EvictedPages: PageCounts{DRAM: 2, SSD: 1},
		DemotedPages: 2,
	}
	if r.Counters != want {
		t.Fatalf("got  %+v\nwant %+v", r.Counters, want)
	}
}

func TestSharingTwoHostsRoundRobin(t *testing.T) {
	// Round-robin: request 0 → host 0, 1 → host 1, 2 → host 0. 641 tokens:
	// 10 whole pages, all hittable (the last token is computed anyway).
	trace := line(0, 641, 1, 2) + line(100, 641, 1, 2) + line(200, 641, 1, 2)
	cfg := tinyConfig()
	cfg.Hosts = 2
	off := run(t, cfg, trace)
	if off.Tokens.Remote != 0 || off.Tokens.DRAM != 640 || off.Tokens.Miss != 1283 {
		t.Fatalf("sharing off: %+v: want only request 2 to hit (locally)", off.Tokens)
	}
	cfg.Sharing = true
	on := run(t, cfg, trace)
	if on.Tokens.Remote != 640 || on.Tokens.DRAM != 640 || on.Tokens.Miss != 643 {
		t.Fatalf("sharing on: %+v: want request 1 remote, request 2 local", on.Tokens)
	}
	// The remote fetch saved a local copy on host 1.
	if on.Bytes.HBMToDRAM != 2*640*16 {
		t.Fatalf("saved %d bytes: want both hosts to hold the 10 pages", on.Bytes.HBMToDRAM)
	}
}

func TestRemoteExtendsLocalPrefix(t *testing.T) {
	// Host 0 holds blocks 1,2 (request 0); host 1 holds block 1 (request 1).
	// Request 1 fetches block 1 from host 0; request 2 (elsewhere) sends
	// request 3 to host 1: local block 1, remote block 2, computed block 3.
	trace := line(0, 1025, 1, 2) + line(100, 513, 1) + line(200, 64, 9) + line(300, 1537, 1, 2, 3)
	cfg := tinyConfig()
	cfg.Hosts, cfg.Sharing = 2, true
	r := run(t, cfg, trace)
	if r.Tokens.DRAM != 512 || r.Tokens.Remote != 512+512 {
		t.Fatalf("tokens %+v: want request 1 remote 512, request 3 local 512 + remote 512", r.Tokens)
	}
}

func TestQueueingIsFCFSPerHost(t *testing.T) {
	trace := line(0, 1000, 1) + line(0, 1000, 2) + line(0, 1000, 3)
	r := run(t, tinyConfig(), trace)
	// 1 ms each, one at a time: TTFTs 1, 2, 3 ms.
	if r.TTFTms.Mean != 2 || r.TTFTms.Max != 3 || r.SpanS != 0.003 {
		t.Fatalf("ttft %+v span %v: want 1, 2, 3 ms", r.TTFTms, r.SpanS)
	}
	cfg := tinyConfig()
	cfg.Hosts, cfg.Router = 3, LeastLoaded
	if r := run(t, cfg, trace); r.TTFTms.Max != 1 {
		t.Fatalf("3 hosts, least-loaded: ttft %+v: want 1 ms each", r.TTFTms)
	}
}

func TestPinnedPagesAreNotEvicted(t *testing.T) {
	cfg := tinyConfig()
	cfg.DRAMBytes, cfg.SSDBytes = cfg.PageBytes(), 0
	var c Counters
	s, err := newStore(cfg, &c)
	if err != nil {
		t.Fatal(err)
	}
	defer s.close()
	keys := PageKeys(cfg.Model.Layout(64).Fingerprint(), 64, Request{InputTokens: 128, HashIDs: []int64{1}})
	if err := s.save(keys[0], false); err != nil {
		t.Fatal(err)
	}
	s.pin(keys[0], s.cat.Lookup(keys[:1], 0).Tiers[0])
	if err := s.save(keys[1], false); err != nil || c.UnsavedPages != 1 || s.cat.Len() != 1 {
		t.Fatalf("save beside a pinned page: err %v, unsaved %d, entries %d: want it refused", err, c.UnsavedPages, s.cat.Len())
	}
	s.unpin(keys[0], 1)
	if err := s.save(keys[1], false); err != nil || c.EvictedPages.DRAM != 1 {
		t.Fatalf("after unpin: err %v, evicted %d: want page 0 evicted", err, c.EvictedPages.DRAM)
	}
}

// randomTrace is a trace of conversations that extend shared prefixes.
func randomTrace(seed uint64, n int) string {
	rng := rand.New(rand.NewPCG(seed, 1))
	var b strings.Builder
	var convs [][]int
	next := 0
	for i := range n {
		var ids []int
		if len(convs) > 0 && rng.IntN(3) > 0 {
			c := rng.IntN(len(convs))
			ids = append(ids, convs[c]...)
		}
		for range 1 + rng.IntN(6) {
			ids = append(ids, next)
			next++
		}
		convs = append(convs, ids)
		input := (len(ids)-1)*512 + 1 + rng.IntN(512)
		b.WriteString(line(int64(i*5+rng.IntN(5)), input, ids...))
	}
	return b.String()
}

func TestDeterministicAndConsistent(t *testing.T) {
	trace := randomTrace(42, 300)
	for _, sharing := range []bool{false, true} {
		for _, router := range Routers {
			cfg := tinyConfig()
			cfg.Hosts, cfg.Sharing, cfg.Router = 3, sharing, router
			cfg.HBMTokens = 4096
			cfg.DRAMBytes, cfg.SSDBytes = 200*cfg.PageBytes(), 500*cfg.PageBytes()
			cfg.Cost = CostModel{PrefillUsPerToken: 2, DRAMGBps: 0.05, SSDGBps: 0.01, NetGBps: 0.02}
			a, b := run(t, cfg, trace), run(t, cfg, trace)
			if !reflect.DeepEqual(a, b) {
				t.Fatalf("sharing %v router %s: two runs differ:\n%+v\n%+v", sharing, router, a, b)
			}
			if a.EvictedPages.DRAM == 0 || a.EvictedPages.SSD == 0 {
				t.Errorf("sharing %v router %s: no evictions (%+v): the test does not exercise them", sharing, router, a.EvictedPages)
			}
			if sharing && a.Tokens.Remote == 0 {
				t.Errorf("router %s: sharing gave no remote hits", router)
			}
		}
	}
}

// slowSSD is tinyConfig with one page of DRAM and an SSD far slower than
// recompute, the peer's cut of slow SSD pages modeled.
func slowSSD() Config {
	cfg := tinyConfig()
	cfg.DRAMBytes = cfg.PageBytes()
	cfg.Cost.SSDGBps = 0.001
	cfg.SSDCut = true
	return cfg
}

func TestSSDCutLeavesSlowSSDPagesToCompute(t *testing.T) {
	// p0 is demoted to SSD by q0, then asked for again.
	trace := line(0, 65, 1) + line(100, 65, 2) + line(200, 65, 1)
	cfg := slowSSD()
	if r := run(t, cfg, trace); r.Tokens.SSD != 0 || r.Tokens.Miss != 3*65 {
		t.Fatalf("with the cut: tokens %+v, want no SSD hit", r.Tokens)
	}
	cfg.SSDCut = false
	if r := run(t, cfg, trace); r.Tokens.SSD != 64 {
		t.Fatalf("without the cut: tokens %+v, want p0 from SSD", r.Tokens)
	}
}

func TestReadmissionBringsAComputedSSDPageBack(t *testing.T) {
	// p0 demoted by q0; the third request computes p0 (cut) and saves it:
	// readmitted into DRAM, the fourth finds it there. Before readmission
	// it stayed on SSD, and every later request computed it again.
	// With two DRAM pages the flusher keeps one free (p0 demoted ahead of
	// need), and the readmission takes it.
	trace := line(0, 65, 1) + line(100, 65, 2) + line(200, 65, 1) + line(300, 65, 1)
	cfg := slowSSD()
	cfg.DRAMBytes = 2 * cfg.PageBytes()
	if r := run(t, cfg, trace); r.Tokens.DRAM != 64 {
		t.Fatalf("readmission: tokens %+v, want the fourth request's page from DRAM", r.Tokens)
	}
	cfg.NoReadmit = true
	if r := run(t, cfg, trace); r.Tokens.DRAM != 0 || r.Tokens.SSD != 0 {
		t.Fatalf("no readmission: tokens %+v, want nothing restored", r.Tokens)
	}
	// With one DRAM page, held by q1's page only there, a readmission finds
	// no slot free of a write and, as the peer's, demotes nothing for one.
	cfg = slowSSD()
	if r := run(t, cfg, trace); r.Tokens.DRAM != 0 || r.DemotedPages != 1 {
		t.Fatalf("readmission with no slot free of a write: tokens %+v, %d demoted; want nothing from DRAM, only q1's demotion of p0",
			r.Tokens, r.DemotedPages)
	}
}

// TestReadmissionsJudgedKeepTheHotPrefixesInDRAM: the seeds' situation in
// small — twelve prefixes of eight pages coming back in turn, a quarter of
// the requests new, a DRAM tier of 40 pages and an SSD slower than
// recomputing, so SSD-only pages are recomputed and saved again. Readmitted
// without judging (ReadmitAll), each readmission pushes out a page about to
// be asked for; judged (the peer's rule, fabric/store/readmit.go), pages
// asked for no more often than the one they would push out stay on SSD, and
// DRAM serves more.
func TestReadmissionsJudgedKeepTheHotPrefixesInDRAM(t *testing.T) {
	var b strings.Builder
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 600 {
		id := int64(i%12) * 100
		if rng.Float64() >= 0.75 {
			id = int64(10_000 + i*100) // a new prefix
		}
		ids := make([]int, 8)
		for j := range ids {
			ids[j] = int(id) + j
		}
		b.WriteString(line(int64(i), 8*BlockTokens+1, ids...))
	}
	cfg := tinyConfig()
	cfg.PageTokens = BlockTokens
	cfg.DRAMBytes, cfg.SSDBytes = 40*cfg.PageBytes(), 1<<30
	cfg.SSDCut, cfg.Cost.SSDGBps = true, 1e-6 // reading a page takes longer than computing it
	if !cfg.ssdSlower() {
		t.Fatal("the SSD is not slower than recompute")
	}
	judged := run(t, cfg, b.String())
	cfg.ReadmitAll = true
	all := run(t, cfg, b.String())
	if judged.ColderReadmits == 0 || all.ColderReadmits != 0 {
		t.Fatalf("colder readmissions %d judged, %d with ReadmitAll; want some, none", judged.ColderReadmits, all.ColderReadmits)
	}
	if judged.Tokens.DRAM <= all.Tokens.DRAM {
		t.Fatalf("DRAM served %d tokens judged, %d readmitting all: want more judged", judged.Tokens.DRAM, all.Tokens.DRAM)
	}
	t.Logf("DRAM served %d tokens judged (%d readmissions refused), %d readmitting all", judged.Tokens.DRAM, judged.ColderReadmits, all.Tokens.DRAM)
}
