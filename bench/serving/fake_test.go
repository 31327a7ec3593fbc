package serving

import (
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"
)

// fakeEngine is an OpenAI-style SSE server whose output is a pure function of
// the prompt (so reused prompts match their reference) unless corrupt says
// otherwise.
type fakeEngine struct {
	firstDelay, tokenDelay time.Duration
	corrupt                func(call int64) bool // true: this call's output is altered
	calls                  atomic.Int64
}

func (f *fakeEngine) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodGet && r.URL.Path == "/v1/models" { // readiness, as a restart waits for it
		fmt.Fprint(w, `{"data":[]}`)
		return
	}
	var body struct {
		Prompt    []int `json:"prompt"`
		MaxTokens int   `json:"max_tokens"`
		Stream    bool  `json:"stream"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil || !body.Stream || len(body.Prompt) == 0 {
		http.Error(w, `{"error":{"message":"bad request"}}`, http.StatusBadRequest)
		return
	}
	call := f.calls.Add(1)
	h := fnv.New32a()
	for _, t := range body.Prompt {
		fmt.Fprint(h, t, ",")
	}
	seed := h.Sum32()
	if f.corrupt != nil && f.corrupt(call) {
		seed++
	}
	w.Header().Set("Content-Type", "text/event-stream")
	fl := w.(http.Flusher)
	send := func(v any) {
		b, _ := json.Marshal(v)
		fmt.Fprintf(w, "data: %s\n\n", b)
		fl.Flush()
	}
	// A role-only chunk first: TTFT must not stop at empty text.
	send(map[string]any{"choices": []map[string]any{{"text": ""}}})
	time.Sleep(f.firstDelay)
	for i := range body.MaxTokens {
		if i > 0 {
			time.Sleep(f.tokenDelay)
		}
		send(map[string]any{"choices": []map[string]any{{"text": fmt.Sprintf("<%d>", (seed+uint32(i))%97)}}})
	}
	send(map[string]any{"choices": []map[string]any{{"text": "", "finish_reason": "length"}},
		"usage": map[string]any{"prompt_tokens": len(body.Prompt), "completion_tokens": body.MaxTokens,
			"prompt_tokens_details": map[string]any{"cached_tokens": len(body.Prompt) / 2}}})
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func startFake(t *testing.T, f *fakeEngine) string {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return srv.URL
}

// fakePeer serves /metrics whose drain gauges fall to 0 after busyScrapes
// scrapes (never, if busyScrapes < 0).
type fakePeer struct {
	busyScrapes int64
	scrapes     atomic.Int64
}

func (p *fakePeer) ServeHTTP(w http.ResponseWriter, _ *http.Request) {
	n := p.scrapes.Add(1)
	busy := 0
	if p.busyScrapes < 0 || n <= p.busyScrapes {
		busy = 1
	}
	fmt.Fprintf(w, "# TYPE orbitkv_fabric_lookup_hit_pages_total counter\norbitkv_fabric_lookup_hit_pages_total %d\n", n*10)
	fmt.Fprintf(w, "# TYPE orbitkv_fabric_lookup_miss_pages_total counter\norbitkv_fabric_lookup_miss_pages_total %d\n", n*5)
	for _, g := range DrainGauges {
		fmt.Fprintf(w, "# TYPE %s gauge\n%s %d\n", g, g, busy)
	}
	fmt.Fprintf(w, "# TYPE orbitkv_tiers_pages gauge\norbitkv_tiers_pages{tier=\"dram\"} %d\n", n)
}
