package pagekey

import (
	"errors"
	"testing"
)

func tinyFP() Fingerprint {
	return Layout{Model: "m", PageTokens: 4}.Fingerprint()
}

func mustChain(t *testing.T, x *RequestExtras, tokens []uint32) []Key {
	t.Helper()
	ks, err := ChainExtras(tinyFP(), 4, tokens, x)
	if err != nil {
		t.Fatal(err)
	}
	return ks
}

var twelve = []uint32{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12}

func TestNoExtrasKeepTheOldKeys(t *testing.T) {
	old := Chain(tinyFP(), 4, twelve)
	for _, x := range []*RequestExtras{nil, {}, {MM: []MMInput{{ID: "tail", Offset: 12, Length: 3}}}} {
		got := mustChain(t, x, twelve)
		for i := range old {
			if got[i] != old[i] {
				t.Fatalf("extras %+v changed page %d's key", x, i)
			}
		}
	}
}

func TestEachExtraChangesEveryPageFromItsFirst(t *testing.T) {
	base := mustChain(t, nil, twelve)
	cases := map[string]struct {
		x     RequestExtras
		first int // first page whose key differs
	}{
		"lora":        {RequestExtras{LoRA: &LoRA{Name: "a", Path: "/p"}}, 0},
		"salt":        {RequestExtras{Salt: "tenant"}, 0},
		"mm page 1":   {RequestExtras{MM: []MMInput{{ID: "img", Offset: 5, Length: 2}}}, 1},
		"mm boundary": {RequestExtras{MM: []MMInput{{ID: "img", Offset: 3, Length: 2}}}, 0},
	}
	for name, c := range cases {
		got := mustChain(t, &c.x, twelve)
		for i := range base {
			if (got[i] != base[i]) != (i >= c.first) {
				t.Fatalf("%s: page %d differs=%v, want differing from page %d", name, i, got[i] != base[i], c.first)
			}
		}
	}
}

func TestSaltIsKeyedOnPageZeroOnly(t *testing.T) {
	x := &RequestExtras{Salt: "s"}
	got := mustChain(t, x, twelve)
	// page 1 is keyed without extras, after the salted page 0
	if NextExtra(tinyFP(), got[0], twelve[4:8], nil) != got[1] {
		t.Fatal("page 1 must carry no salt of its own")
	}
}

func TestEncodingIsUnambiguous(t *testing.T) {
	enc := func(p PageExtras) string { return string(p.Encode()) }
	pairs := [][2]PageExtras{
		{{LoRA: &LoRA{Name: "ab", Path: "c"}}, {LoRA: &LoRA{Name: "a", Path: "bc"}}},
		{{LoRA: &LoRA{Name: "x"}}, {Salt: "x"}},
		{{MM: []PageMM{{ID: "i", Offset: 1, Length: 2}}}, {MM: []PageMM{{ID: "i", Offset: 2, Length: 1}}}},
		{{MM: []PageMM{{ID: "i", Offset: -1, Length: 2}}}, {MM: []PageMM{{ID: "i", Offset: 1, Length: 2}}}},
		{{MM: []PageMM{{ID: "a", Offset: 0, Length: 1}, {ID: "b", Offset: 2, Length: 1}}},
			{MM: []PageMM{{ID: "b", Offset: 2, Length: 1}, {ID: "a", Offset: 0, Length: 1}}}},
	}
	for _, p := range pairs {
		if enc(p[0]) == enc(p[1]) {
			t.Fatalf("%+v and %+v encode alike", p[0], p[1])
		}
	}
	if (PageExtras{}).Encode() != nil {
		t.Fatal("no extras must encode to nothing")
	}
}

func TestUnkeyableExtrasFail(t *testing.T) {
	for _, x := range []*RequestExtras{
		{MM: []MMInput{{ID: "", Offset: 0, Length: 4}}},
		{Embeds: []string{"00"}},
		{Embeds: []string{"6c2f1b0a4e5d7c8b9a0f1e2d3c4b5a69788796a5b4c3d2e1f00f1e2d3c4b5a69"}}, // one page of three
	} {
		if _, err := ChainExtras(tinyFP(), 4, twelve, x); !errors.Is(err, ErrExtras) {
			t.Fatalf("%+v: want ErrExtras, got %v", x, err)
		}
	}
}
