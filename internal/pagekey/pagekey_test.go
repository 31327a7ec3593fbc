package pagekey

import (
	"encoding/hex"
	"encoding/json"
	"flag"
	"os"
	"testing"
)

var update = flag.Bool("update", false, "rewrite testdata/vectors.json")

// vector is one shared Go/Python test case.
type vector struct {
	Name        string         `json:"name"`
	Layout      Layout         `json:"layout"`
	Fingerprint string         `json:"fingerprint"`
	Tokens      []uint32       `json:"tokens"`
	Extras      *RequestExtras `json:"extras,omitempty"`
	Keys        []string       `json:"keys"`
}

func vectorCases() []vector {
	qwen := Layout{Model: "Qwen/Qwen3-8B", Revision: "b968826d9c46dd6066d109eabc6255188de91218", DType: "bf16",
		NumLayers: 36, KVHeads: 8, HeadDim: 128, TPRank: 0, TPSize: 1, PageTokens: 64, ByteLayout: "vllm-flash"}
	tiny := Layout{Model: "orbitkv/tiny", Revision: "seed-0", DType: "fp32",
		NumLayers: 2, KVHeads: 2, HeadDim: 16, TPRank: 0, TPSize: 1, PageTokens: 4, ByteLayout: "ref-paged"}
	rank1 := qwen
	rank1.TPRank, rank1.TPSize = 1, 2
	seq := func(n int, mul uint32) []uint32 {
		t := make([]uint32, n)
		for i := range t {
			t[i] = uint32(i)*mul + 7
		}
		return t
	}
	return []vector{
		{Name: "tiny-three-pages-and-tail", Layout: tiny, Tokens: seq(14, 3)},
		{Name: "qwen3-8b-two-pages", Layout: qwen, Tokens: seq(128, 151)},
		{Name: "qwen3-8b-tp-rank-1", Layout: rank1, Tokens: seq(128, 151)},
		{Name: "large-token-ids", Layout: tiny, Tokens: []uint32{0, 1, 4294967295, 151643, 2, 3, 4, 5}},
		{Name: "shorter-than-a-page", Layout: tiny, Tokens: []uint32{1, 2, 3}},
		// Extras (extras.go): every old vector above keeps its keys.
		{Name: "tiny-lora", Layout: tiny, Tokens: seq(14, 3),
			Extras: &RequestExtras{LoRA: &LoRA{Name: "sql-adapter", Path: "/adapters/sql-lora"}}},
		{Name: "tiny-lora-name-path-boundary", Layout: tiny, Tokens: seq(14, 3),
			Extras: &RequestExtras{LoRA: &LoRA{Name: "sql-adapter/", Path: "adapters/sql-lora"}}},
		{Name: "tiny-cache-salt", Layout: tiny, Tokens: seq(14, 3), Extras: &RequestExtras{Salt: "tenant-α"}},
		{Name: "tiny-mm-spanning-two-pages", Layout: tiny, Tokens: seq(14, 3),
			Extras: &RequestExtras{MM: []MMInput{{ID: "f3a9c0de-image-a", Offset: 2, Length: 5}}}},
		{Name: "tiny-mm-other-image", Layout: tiny, Tokens: seq(14, 3),
			Extras: &RequestExtras{MM: []MMInput{{ID: "0b7e11aa-image-b", Offset: 2, Length: 5}}}},
		{Name: "tiny-mm-only-in-the-tail", Layout: tiny, Tokens: seq(14, 3),
			Extras: &RequestExtras{MM: []MMInput{{ID: "tail-image", Offset: 12, Length: 2}}}},
		{Name: "tiny-everything", Layout: tiny, Tokens: seq(14, 3),
			Extras: &RequestExtras{LoRA: &LoRA{Name: "a", Path: "/a"}, Salt: "s",
				MM: []MMInput{{ID: "second", Offset: 9, Length: 2}, {ID: "first", Offset: 1, Length: 3}, {ID: "empty", Offset: 5, Length: 0}},
				Embeds: []string{
					"6c2f1b0a4e5d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69",
					"00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff",
					"ffeeddccbbaa99887766554433221100ffeeddccbbaa99887766554433221100"}}},
		{Name: "qwen3-8b-lora-and-salt", Layout: qwen, Tokens: seq(128, 151),
			Extras: &RequestExtras{LoRA: &LoRA{Name: "tenant-7-adapter", Path: "org/qwen3-8b-lora"}, Salt: "tenant-7"}},
	}
}

func TestVectors(t *testing.T) {
	cases := vectorCases()
	for i := range cases {
		c := &cases[i]
		fp := c.Layout.Fingerprint()
		c.Fingerprint = hex.EncodeToString(fp[:])
		c.Keys = []string{}
		ks, err := ChainExtras(fp, int(c.Layout.PageTokens), c.Tokens, c.Extras)
		if err != nil {
			t.Fatalf("%s: %v", c.Name, err)
		}
		for _, k := range ks {
			c.Keys = append(c.Keys, k.String())
		}
	}
	got, err := json.MarshalIndent(cases, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	const path = "testdata/vectors.json"
	if *update {
		if err := os.WriteFile(path, append(got, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if string(want) != string(got)+"\n" {
		t.Fatalf("keys differ from %s; if the key scheme changed on purpose, run with -update and update Python too", path)
	}
}

func TestChainPrefixProperty(t *testing.T) {
	fp := Layout{Model: "m", PageTokens: 4}.Fingerprint()
	a := Chain(fp, 4, []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9})
	b := Chain(fp, 4, []uint32{1, 2, 3, 4, 5, 6, 7, 9})
	if len(a) != 2 || len(b) != 2 {
		t.Fatalf("want 2 whole pages, got %d and %d", len(a), len(b))
	}
	if a[0] != b[0] {
		t.Fatal("equal first pages must give equal keys")
	}
	if a[1] == b[1] {
		t.Fatal("a different token in page 1 must change its key")
	}
	other := Layout{Model: "m", PageTokens: 4, DType: "bf16"}.Fingerprint()
	if Chain(other, 4, []uint32{1, 2, 3, 4})[0] == a[0] {
		t.Fatal("different layouts must give different keys")
	}
}

func TestFromBytes(t *testing.T) {
	if _, err := FromBytes(make([]byte, 15)); err == nil {
		t.Fatal("want an error for a 15-byte key")
	}
	k, err := FromBytes(make([]byte, 16))
	if err != nil || k != (Key{}) {
		t.Fatalf("got %v %v", k, err)
	}
}
