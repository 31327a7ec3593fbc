package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/internal/router"
)

// The reference router across three hosts (network namespaces on one
// bridge): a peer and a reference engine on each, the router in this
// namespace asking host-a's peer where each prompt's pages are. A prompt's
// first request lands round robin and its engine saves the pages into its
// host's DRAM; routed again, it goes to that host and restores from that
// host's own DRAM (no page fetched); sent round robin to another host, it
// fetches the pages from the holder (or recomputes), never restoring what
// its own host did not hold.

const (
	routePrompts      = 6
	routePromptPages  = 4
	routePromptTokens = routePromptPages*refPageTokens + 5
	routeBudget       = 4 * time.Minute
)

// routeLayout is the reference engine's layout for refEngineArgs (tiny
// preset, fp32, page_tokens 16), as its vLLM-style connector declares it.
const routeLayout = `{"model":"refengine/tiny","revision":"refengine-seed-0","dtype":"fp32","num_layers":2,"kv_heads":2,` +
	`"head_dim":16,"tp_rank":0,"tp_size":1,"page_tokens":16,"byte_layout":"vllm-flash"}`

type routeEnv struct {
	lan     *lan
	peers   [3]*proc
	engines [3]*refEngine
	urls    map[string]string // engine URL by host name
}

func TestRouterThreeHosts(t *testing.T) { testRouterThreeHosts(t) }

// TestRouterThreeHostsCompact is the same with every peer publishing a
// compact catalog (docs/cluster.md, "Scaling the catalog"): the route's
// candidates come from the filters and are confirmed by Holds.
func TestRouterThreeHostsCompact(t *testing.T) { testRouterThreeHosts(t, "--cluster-compact-catalog") }

// testRouterThreeHosts runs the router's test with flags added to every peer.
func testRouterThreeHosts(t *testing.T, flags ...string) {
	py := refPython(t)
	l := threeHosts(t, 3)
	ctx, cancel := context.WithTimeout(context.Background(), routeBudget)
	defer cancel()
	env := startRouteEnv(t, py, l, flags...)
	routed := newRouter(t, env.peers[0].metrics, env.urls)
	blind := newRouter(t, "127.0.0.1:1", env.urls) // a peer that never answers: round robin only

	rng := mrand.New(mrand.NewPCG(38, 1))
	prompts := make([][]int, routePrompts)
	for i := range prompts {
		prompts[i] = make([]int, routePromptTokens)
		for j := range prompts[i] {
			prompts[i][j] = rng.IntN(512)
		}
	}
	// First sight: nobody holds a page, so round robin; the engine saves.
	holder := make([]string, routePrompts)
	want := make([][]int, routePrompts)
	for i, p := range prompts {
		r := send(t, ctx, routed, p)
		if r.route != "round-robin" || r.restored != 0 {
			t.Fatalf("prompt %d's first request: %s, restored %d; want round robin, nothing restored", i, r.route, r.restored)
		}
		holder[i], want[i] = r.engine, r.tokens
	}
	for i, p := range prompts {
		env.waitRouted(t, p, holder[i])
	}

	t.Run("routed", func(t *testing.T) {
		for i, p := range prompts {
			h := hostIndex(holder[i])
			before := env.counters(h)
			r := send(t, ctx, routed, p)
			if r.engine != holder[i] || r.route != fmt.Sprintf("routed %d", routePromptPages) {
				t.Fatalf("prompt %d went to %s (%s), want %s routed", i, r.engine, r.route, holder[i])
			}
			after := env.counters(h)
			if r.restored != routePromptPages*refPageTokens || after.dram-before.dram != routePromptPages || after.fetched != before.fetched {
				t.Fatalf("prompt %d on %s: restored %d tokens, dram pages loaded +%v, fetched +%v; want %d tokens, all from its own DRAM",
					i, holder[i], r.restored, after.dram-before.dram, after.fetched-before.fetched, routePromptPages*refPageTokens)
			}
			if !slices.Equal(r.tokens, want[i]) {
				t.Fatalf("prompt %d: restored output %v differs from the computed %v", i, r.tokens, want[i])
			}
		}
	})
	t.Run("round-robin", func(t *testing.T) {
		// Prompt i+1 is sent as the blind router's i-th request: to the host
		// after its holder (the first pass's round robin put prompt i on host i%3).
		remote := 0
		for j := range prompts {
			i := (j + 1) % routePrompts
			before := [3]tierCounters{env.counters(0), env.counters(1), env.counters(2)}
			r := send(t, ctx, blind, prompts[i])
			if r.route != "round-robin" {
				t.Fatalf("blind router routed: %s", r.route)
			}
			target := hostIndex(r.engine)
			if r.engine == holder[i] {
				t.Fatalf("prompt %d went back to its holder %s; the test's rotation is off", i, r.engine)
			}
			after := env.counters(target)
			fetched := int(after.fetched - before[target].fetched)
			if r.restored != fetched*refPageTokens {
				t.Fatalf("prompt %d on %s: restored %d tokens but fetched %d pages; only fetched pages may restore", i, r.engine, r.restored, fetched)
			}
			if got := int(after.remote - before[target].remote); got != fetched {
				t.Fatalf("prompt %d on %s: %d pages loaded as remote, %d fetched", i, r.engine, got, fetched)
			}
			if fetched > 0 {
				remote++
			}
			if !slices.Equal(r.tokens, want[i]) {
				t.Fatalf("prompt %d on %s: output %v differs from %v", i, r.engine, r.tokens, want[i])
			}
		}
		t.Logf("round robin: %d of %d prompts fetched their pages from the holder, the rest recomputed", remote, routePrompts)
	})
}

func startRouteEnv(t *testing.T, py string, l *lan, flags ...string) *routeEnv {
	env := &routeEnv{lan: l, urls: map[string]string{}}
	for i, h := range l.hosts {
		args := []string{"--cluster-addr", h.addr + ":7946", "--node-name", hostName(i), "--cluster-insecure",
			"--metrics-addr", h.addr + ":9464"}
		if i > 0 {
			args = append(args, "--cluster-join", l.hosts[0].addr+":7946")
		}
		env.peers[i] = startPeerIn(t, h.ns, t.TempDir(), append(args, flags...)...)
	}
	waitFor(t, "3 members on every peer", 30*time.Second, func() bool {
		for _, p := range env.peers {
			if scrape(p, "orbitkv_cluster_members") != 3 {
				return false
			}
		}
		return true
	})
	for i, h := range l.hosts {
		env.engines[i] = startRefEngine(t, py, "engine ("+hostName(i)+")", h.ns, h.addr, "--connector", "orbitkv",
			"--orbitkv-socket", env.peers[i].socket, "--no-prefix-caching",
			"--connector-extra", fmt.Sprintf(`{"engine_id":"engine-%c","timeout_s":5}`, 'a'+i))
		env.urls[hostName(i)] = env.engines[i].url
	}
	return env
}

func newRouter(t *testing.T, peer string, engines map[string]string) *httptest.Server {
	t.Helper()
	rt, err := router.New(router.Config{Peer: peer, Engines: engines, Layout: json.RawMessage(routeLayout), RouteTimeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s := httptest.NewServer(rt)
	t.Cleanup(s.Close)
	return s
}

func hostIndex(name string) int { return int(name[len(name)-1] - 'a') }

// routedAnswer is what one request through a router gave.
type routedAnswer struct {
	engine, route string
	restored      int
	tokens        []int
}

func send(t *testing.T, ctx context.Context, rt *httptest.Server, prompt []int) routedAnswer {
	t.Helper()
	body, _ := json.Marshal(map[string]any{"prompt": prompt, "max_tokens": 4})
	req, err := http.NewRequestWithContext(ctx, "POST", rt.URL+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("router: HTTP %d: %s", resp.StatusCode, raw)
	}
	var out struct {
		Choices []struct {
			TokenIDs []int `json:"token_ids"`
		} `json:"choices"`
		Usage struct {
			Restored int `json:"orbitkv_restored_tokens"`
		} `json:"usage"`
	}
	if err := json.Unmarshal(raw, &out); err != nil || len(out.Choices) != 1 {
		t.Fatalf("bad answer %q: %v", raw, err)
	}
	return routedAnswer{engine: resp.Header.Get(router.HeaderEngine), route: resp.Header.Get(router.HeaderRoute),
		restored: out.Usage.Restored, tokens: out.Choices[0].TokenIDs}
}

// waitRouted waits until host-a's peer ranks holder first for prompt, with
// every page of it, confirmed.
func (env *routeEnv) waitRouted(t *testing.T, prompt []int, holder string) {
	t.Helper()
	q := fmt.Sprintf(`{"layout":%s,"tokens":%s}`, routeLayout, strings.Join(strings.Fields(fmt.Sprint(prompt)), ","))
	var last string
	defer func() {
		if t.Failed() {
			t.Logf("last route answer: %s", last)
		}
	}()
	waitFor(t, "host-a's route to rank "+holder+" first", 10*time.Second, func() bool {
		resp, err := http.Post("http://"+env.peers[0].metrics+"/v1/route", "application/json", strings.NewReader(q))
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var a router.Answer
		raw, _ := io.ReadAll(resp.Body)
		last = string(raw)
		return json.Unmarshal(raw, &a) == nil && len(a.Hosts) > 0 && a.Hosts[0].Name == holder &&
			a.Hosts[0].Pages == routePromptPages && a.Hosts[0].State == "alive"
	})
}

// tierCounters are a peer's load counters.
type tierCounters struct{ dram, remote, fetched float64 }

func (env *routeEnv) counters(i int) tierCounters {
	p := env.peers[i]
	return tierCounters{dram: scrape(p, `orbitkv_fabric_loaded_pages_total{tier="dram"}`),
		remote:  scrape(p, `orbitkv_fabric_loaded_pages_total{tier="remote"}`),
		fetched: scrape(p, `orbitkv_cluster_fetched_pages_total{result="ok"}`)}
}
