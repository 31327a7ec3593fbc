package fabric

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// postRoute posts body to tp's POST /v1/route and decodes the answer.
func postRoute(t *testing.T, tp *testPeer, body string) (int, RouteAnswer, string) {
	t.Helper()
	resp, err := http.Post("http://"+tp.metricsAddr()+"/v1/route", "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var raw bytes.Buffer
	raw.ReadFrom(resp.Body)
	var ans RouteAnswer
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(raw.Bytes(), &ans); err != nil {
			t.Fatalf("decode %q: %v", raw.String(), err)
		}
	}
	return resp.StatusCode, ans, raw.String()
}

func hexKeys(keys [][]byte) string {
	var s []string
	for _, k := range keys {
		s = append(s, `"`+hex.EncodeToString(k)+`"`)
	}
	return `{"keys":[` + strings.Join(s, ",") + `]}`
}

// TestRouteThroughListeners: the admin service's Route and the metrics
// listener's POST /v1/route rank two clustered peers by the leading pages
// of a chain each holds, with each run's tier: a peer holding pages 1..5
// but not page 0 has no leading run and is not listed, the other's run is
// reported as DRAM then SSD, confirmed by it; once the first holds page 0
// too, it ranks first.
func TestRouteThroughListeners(t *testing.T) {
	creds := writeCreds(t, t.TempDir(), bytes.Repeat([]byte{7}, 32))
	a := startPeer(t, clusterConfig(t, creds, ""))
	b := startPeer(t, clusterConfig(t, creds, a.gossipAddr()))
	waitFor(t, "two members", 10*time.Second, func() bool { return a.members() == 2 && b.members() == 2 })
	ea, eb := a.engine(tinyFlash), b.engine(tinyFlash)
	keys := randKeys(6)
	src := refs(keys, 0, 4)
	okOp(t)(ea.Save(ctx(t), src[1:], pb.Durability_DURABILITY_DRAM))
	okOp(t)(eb.Save(ctx(t), src[:2], pb.Durability_DURABILITY_DRAM))
	okOp(t)(eb.Save(ctx(t), src[2:4], pb.Durability_DURABILITY_SSD))
	if _, err := b.admin.Evict(ctx(t), &pb.EvictRequest{Tier: pb.Tier_TIER_DRAM, Keys: keys[2:4]}); err != nil {
		t.Fatal(err)
	}

	want := `[b alive 4 [TIER_DRAM:2 TIER_SSD:2] confirmed]`
	var got string
	waitFor(t, "a's route to see b's run", 10*time.Second, func() bool {
		resp, err := a.admin.Route(ctx(t), &pb.RouteRequest{Keys: keys})
		if err != nil {
			t.Fatal(err)
		}
		got = routeSummary(resp, b.p.cluster.Name())
		return got == want && resp.PromptPages == 6
	})

	code, ans, raw := postRoute(t, a, hexKeys(keys))
	if code != http.StatusOK || ans.PromptPages != 6 || len(ans.Hosts) != 1 {
		t.Fatalf("POST /v1/route: %d %s", code, raw)
	}
	h := ans.Hosts[0]
	if h.Name != b.p.cluster.Name() || h.Self || h.State != "alive" || h.Pages != 4 || !h.Confirmed ||
		len(h.Runs) != 2 || h.Runs[0] != (RouteRun{"dram", 2}) || h.Runs[1] != (RouteRun{"ssd", 2}) || h.PeerAddr == "" {
		t.Fatalf("POST /v1/route host: %s", raw)
	}

	// a saves page 0: its own run is now the whole chain, and it ranks first.
	okOp(t)(ea.Save(ctx(t), src[:1], pb.Durability_DURABILITY_DRAM))
	resp, err := a.admin.Route(ctx(t), &pb.RouteRequest{Keys: keys})
	if err != nil {
		t.Fatal(err)
	}
	if got := routeSummary(resp, b.p.cluster.Name()); got != `[self alive 6 [TIER_DRAM:6] confirmed b alive 4 [TIER_DRAM:2 TIER_SSD:2] confirmed]` {
		t.Fatalf("route after a holds page 0: %s", got)
	}
}

// TestRouteBadInput: a route query the peer cannot key is a 400 (HTTP) or
// InvalidArgument (gRPC) with the reason; a layout with tokens is keyed by
// the peer (whole pages only).
func TestRouteBadInput(t *testing.T) {
	a := startPeer(t, smallConfig(t.TempDir()))
	layout := `{"model":"m","revision":"r","dtype":"bf16","num_layers":2,"kv_heads":2,"head_dim":16,"tp_rank":0,"tp_size":1,"page_tokens":4,"byte_layout":"ref-paged"}`
	for _, tt := range []struct{ name, body, want string }{
		{"empty", `{}`, "route needs keys"},
		{"short key", `{"keys":["abcd"]}`, "key 0"},
		{"not hex", `{"keys":["zz"]}`, "key 0"},
		{"keys and tokens", `{"keys":["` + strings.Repeat("00", 16) + `"],"tokens":[1]}`, "not both"},
		{"no page size", `{"layout":` + strings.Replace(layout, `"page_tokens":4`, `"page_tokens":0`, 1) + `,"tokens":[1]}`, "page_tokens"},
		{"unknown field", `{"prompt":"hi"}`, "unknown field"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			code, _, raw := postRoute(t, a, tt.body)
			if code != http.StatusBadRequest || !strings.Contains(raw, tt.want) {
				t.Fatalf("POST %s: %d %s, want 400 with %q", tt.body, code, raw, tt.want)
			}
		})
	}
	code, ans, raw := postRoute(t, a, `{"layout":`+layout+`,"tokens":[1,2,3,4,5,6,7,8,9]}`)
	if code != http.StatusOK || ans.PromptPages != 2 || len(ans.Hosts) != 0 {
		t.Fatalf("route of 9 tokens in pages of 4: %d %s", code, raw)
	}
	if _, err := a.admin.Route(ctx(t), &pb.RouteRequest{}); err == nil || !strings.Contains(err.Error(), "InvalidArgument") {
		t.Fatalf("gRPC Route without keys: %v", err)
	}
}

// routeSummary prints resp's hosts compactly, naming other self.
func routeSummary(resp *pb.RouteResponse, other string) string {
	var parts []string
	for _, h := range resp.Hosts {
		name := h.Name
		switch {
		case h.Self:
			name = "self"
		case h.Name == other:
			name = "b"
		}
		var runs []string
		for _, r := range h.Runs {
			runs = append(runs, r.Tier.String()+":"+strconv.Itoa(int(r.Pages)))
		}
		c := "confirmed"
		if !h.Confirmed {
			c = "unconfirmed"
		}
		parts = append(parts, name+" "+h.State+" "+strconv.Itoa(int(h.Pages))+" ["+strings.Join(runs, " ")+"] "+c)
	}
	return "[" + strings.Join(parts, " ") + "]"
}
