package router

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestPick(t *testing.T) {
	engines := map[string]string{"a": "", "b": "", "c": ""}
	names := []string{"a", "b", "c"}
	tests := []struct {
		name      string
		ans       Answer
		rr        uint64
		want      string
		wantPages int
	}{
		{"nobody holds a page: round robin", Answer{}, 4, "b", 0},
		{"the best host", Answer{Hosts: []Host{{"c", "alive", 5}, {"a", "alive", 2}}}, 0, "c", 5},
		{"a host without an engine here is skipped", Answer{Hosts: []Host{{"x", "alive", 9}, {"a", "alive", 2}}}, 0, "a", 2},
		{"a suspect host is skipped", Answer{Hosts: []Host{{"c", "suspect", 9}, {"b", "alive", 1}}}, 0, "b", 1},
		{"only unusable hosts: round robin", Answer{Hosts: []Host{{"x", "alive", 9}, {"c", "suspect", 3}}}, 2, "c", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, pages := pick(tt.ans, engines, names, tt.rr)
			if got != tt.want || pages != tt.wantPages {
				t.Errorf("pick = %s %d, want %s %d", got, pages, tt.want, tt.wantPages)
			}
		})
	}
}

// TestRouterForwards: a token prompt goes where the peer says; a text
// prompt, and a prompt while the peer does not answer, go round robin.
func TestRouterForwards(t *testing.T) {
	engine := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, `{"engine":"`+name+`"}`)
		}))
	}
	ea, eb := engine("a"), engine("b")
	defer ea.Close()
	defer eb.Close()
	var asked map[string]any
	peer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		json.NewDecoder(r.Body).Decode(&asked)
		io.WriteString(w, `{"prompt_pages":2,"hosts":[{"name":"b","state":"alive","pages":2,"runs":[{"tier":"dram","pages":2}]}]}`)
	}))
	rt, err := New(Config{Peer: strings.TrimPrefix(peer.URL, "http://"), Engines: map[string]string{"a": ea.URL, "b": eb.URL},
		Layout: json.RawMessage(`{"model":"m"}`), RouteTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(rt)
	defer front.Close()
	post := func(body string) (string, string) {
		resp, err := http.Post(front.URL+"/v1/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		return resp.Header.Get(HeaderEngine), resp.Header.Get(HeaderRoute)
	}
	if e, r := post(`{"prompt":[1,2,3],"max_tokens":1}`); e != "b" || r != "routed 2" {
		t.Errorf("token prompt went to %s (%s), want b routed", e, r)
	}
	if asked["layout"].(map[string]any)["model"] != "m" || len(asked["tokens"].([]any)) != 3 {
		t.Errorf("route query %v", asked)
	}
	if e, r := post(`{"prompt":"hello"}`); r != "round-robin" || e == "" {
		t.Errorf("text prompt went to %s (%s), want round robin", e, r)
	}
	peer.Close()
	seen := map[string]bool{}
	for range 2 {
		e, r := post(`{"prompt":[1,2,3]}`)
		if r != "round-robin" {
			t.Errorf("with the peer down: %s", r)
		}
		seen[e] = true
	}
	if !seen["a"] || !seen["b"] {
		t.Errorf("round robin reached %v, want both engines", seen)
	}
	// One routed; the text prompt and the two the down peer left round robin.
	if c, want := rt.Counts(), (Counts{Routed: 1, RoundRobin: 3, RouteFailed: 2}); c != want {
		t.Errorf("counts %+v, want %+v", c, want)
	}
}

// TestRoundRobinNeverAsksThePeer: with RoundRobin the requests alternate
// over the engines and no route query is made (no peer is configured).
func TestRoundRobinNeverAsksThePeer(t *testing.T) {
	engine := func(name string) *httptest.Server {
		return httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			io.WriteString(w, name)
		}))
	}
	e1, e2 := engine("e1"), engine("e2")
	defer e1.Close()
	defer e2.Close()
	if _, err := New(Config{Engines: map[string]string{"e1": e1.URL}}); err == nil {
		t.Fatal("a routing router without a peer address was accepted")
	}
	rt, err := New(Config{RoundRobin: true, Engines: map[string]string{"e1": e1.URL, "e2": e2.URL}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(rt)
	defer front.Close()
	var got []string
	for range 4 {
		resp, err := http.Post(front.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":[1,2,3]}`))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.Header.Get(HeaderRoute) != "round-robin" {
			t.Errorf("route header %q", resp.Header.Get(HeaderRoute))
		}
		got = append(got, string(b))
	}
	if strings.Join(got, ",") != "e1,e2,e1,e2" {
		t.Errorf("engines in turn: %v", got)
	}
	if c, want := rt.Counts(), (Counts{RoundRobin: 4}); c != want {
		t.Errorf("counts %+v, want %+v", c, want)
	}
}

// TestStreamedAnswerIsNotHeldBack: the client reads an engine's first
// streamed event while the engine still holds back its second (a proxy
// that buffered would deliver nothing until the engine finished).
func TestStreamedAnswerIsNotHeldBack(t *testing.T) {
	second := make(chan struct{})
	eng := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		io.WriteString(w, "data: first\n\n")
		w.(http.Flusher).Flush()
		select {
		case <-second:
		case <-r.Context().Done():
		}
		io.WriteString(w, "data: second\n\n")
	}))
	defer eng.Close()
	defer close(second)
	rt, err := New(Config{RoundRobin: true, Engines: map[string]string{"e": eng.URL}})
	if err != nil {
		t.Fatal(err)
	}
	front := httptest.NewServer(rt)
	defer front.Close()
	resp, err := http.Post(front.URL+"/v1/completions", "application/json", strings.NewReader(`{"prompt":"x","stream":true}`))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	// The engine holds its second event until the test ends, so a buffering
	// proxy delivers nothing: the read is bounded and that is a failure.
	got := make(chan string, 1)
	go func() {
		buf := make([]byte, 64)
		n, _ := resp.Body.Read(buf)
		got <- string(buf[:n])
	}()
	select {
	case s := <-got:
		if !strings.Contains(s, "first") {
			t.Fatalf("first read = %q", s)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("the first streamed event did not come through while the engine held the second (buffered)")
	}
}
