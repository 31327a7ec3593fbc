package serving

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestClientMeasuresStream(t *testing.T) {
	f := &fakeEngine{firstDelay: 30 * time.Millisecond, tokenDelay: 5 * time.Millisecond}
	c := &Client{Endpoint: startFake(t, f) + "/v1", HTTP: http.DefaultClient}
	res := c.Complete(context.Background(), []int{1, 2, 3, 4}, 5)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if res.TTFT < 30*time.Millisecond {
		t.Errorf("TTFT %v ended before the first non-empty text (≥ 30ms)", res.TTFT)
	}
	if res.Chunks != 5 || len(res.ITL) != 4 {
		t.Errorf("chunks %d, ITL samples %d; want 5 and 4", res.Chunks, len(res.ITL))
	}
	// One sample per gap between chunks, measured on arrival: they add up to
	// at most the time from the first chunk to the end. (No lower bound: a
	// loaded machine may deliver chunks the server sent 5 ms apart in one
	// burst, which failed a fresh-clone CI run on 2026-12-06.)
	var sum time.Duration
	for _, d := range res.ITL {
		if d < 0 {
			t.Errorf("ITL %v is negative", d)
		}
		sum += d
	}
	if sum > res.Latency-res.TTFT {
		t.Errorf("ITLs add up to %v, more than the %v from the first chunk to the end", sum, res.Latency-res.TTFT)
	}
	if res.Latency < res.TTFT || res.PromptTokens != 4 || res.CompletionTokens != 5 || res.CachedTokens != 2 {
		t.Errorf("latency %v ttft %v usage %d/%d/%d", res.Latency, res.TTFT, res.PromptTokens, res.CompletionTokens, res.CachedTokens)
	}
	if strings.Count(res.Text, "<") != 5 {
		t.Errorf("text %q", res.Text)
	}
}

func TestClientErrors(t *testing.T) {
	for _, tc := range []struct {
		name    string
		handler http.HandlerFunc
		timeout time.Duration
		want    string
	}{
		{"http status", func(w http.ResponseWriter, _ *http.Request) { http.Error(w, "overloaded", 503) }, time.Second, "HTTP 503"},
		{"no done", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"a\"}]}\n\n")
		}, time.Second, "without [DONE]"},
		{"error event", func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprint(w, "data: {\"error\":{\"message\":\"boom\"}}\n\ndata: [DONE]\n\n")
		}, time.Second, "boom"},
		{"bad json", func(w http.ResponseWriter, _ *http.Request) { fmt.Fprint(w, "data: {oops\n\n") }, time.Second, "bad SSE event"},
		{"deadline", func(w http.ResponseWriter, r *http.Request) {
			w.(http.Flusher).Flush()
			<-r.Context().Done()
		}, 100 * time.Millisecond, "deadline"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			ctx, cancel := context.WithTimeout(context.Background(), tc.timeout)
			defer cancel()
			c := &Client{Endpoint: srv.URL, HTTP: srv.Client()}
			res := c.Complete(ctx, []int{1}, 1)
			if res.Err == nil || !strings.Contains(res.Err.Error(), tc.want) {
				t.Fatalf("err %v; want it to mention %q", res.Err, tc.want)
			}
		})
	}
}

func TestParseMetrics(t *testing.T) {
	in := "# HELP x_total a\n# TYPE x_total counter\nx_total 3\n# TYPE g gauge\ng{tier=\"dram\",k=\"a b\"} 2.5e+00\nuntyped 7 1700000000\n"
	s, err := ParseMetrics(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	if s.Values["x_total"] != 3 || s.Values[`g{tier="dram",k="a b"}`] != 2.5 || s.Values["untyped"] != 7 || s.Types["g"] != "gauge" {
		t.Fatalf("parsed %+v", s)
	}
	if _, err := ParseMetrics(strings.NewReader("x_total notanumber\n")); err == nil {
		t.Fatal("a bad value parsed")
	}
	w := Window{Before: s, After: Sample{Values: map[string]float64{"x_total": 10, "g{tier=\"dram\",k=\"a b\"}": 1}, Types: s.Types}}
	w.Deltas()
	if w.Delta["x_total"] != 7 || len(w.Delta) != 1 {
		t.Fatalf("deltas %v: want only the counter, +7", w.Delta)
	}
}

// TestClientReadsTokenIDStreams: vLLM started without a tokenizer streams
// empty text with return_token_ids; the client times the first token id and
// keeps the ids as the output to compare.
func TestClientReadsTokenIDStreams(t *testing.T) {
	var asked bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		asked = strings.Contains(readAll(r), `"return_token_ids":true`)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"\",\"token_ids\":[]}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"\",\"token_ids\":[17]}]}\n\n")
		fmt.Fprint(w, "data: {\"choices\":[{\"text\":\"\",\"token_ids\":[5,9]}]}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	c := &Client{Endpoint: srv.URL, HTTP: http.DefaultClient}
	res := c.Complete(context.Background(), []int{1, 2}, 3)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	if !asked || res.Text != "<17><5><9>" || res.Chunks != 2 || res.TTFT == 0 {
		t.Errorf("asked %v, text %q, chunks %d, ttft %v", asked, res.Text, res.Chunks, res.TTFT)
	}
}

// TestClientSpeaksSGLangsGenerate: SGLang started with --skip-tokenizer-init
// answers /v1/completions with HTTP 500 (KeyError 'text', seen on the H200 with
// SGLang 0.5.17); its native /generate takes input_ids and streams every output
// id so far in each event, with the token counts in meta_info. The events below
// have the shape of SGLang 0.5.17's tokenizer_manager (BatchTokenIDOutput,
// stream, incremental_streaming_output off); the real server is met on the H200
// (scripts/gpu/sglang.sh).
func TestClientSpeaksSGLangsGenerate(t *testing.T) {
	var path, body string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		path, body = r.URL.Path, readAll(r)
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprint(w, "data: {\"output_ids\":[17],\"meta_info\":{\"id\":\"a\",\"prompt_tokens\":2,\"completion_tokens\":1,\"cached_tokens\":0}}\n\n")
		fmt.Fprint(w, "data: {\"output_ids\":[17,5,9],\"meta_info\":{\"id\":\"a\",\"prompt_tokens\":2,\"completion_tokens\":3,\"cached_tokens\":1,\"finish_reason\":{\"type\":\"length\",\"length\":3}}}\n\n")
		fmt.Fprint(w, "data: [DONE]\n\n")
	}))
	defer srv.Close()
	c := &Client{Endpoint: srv.URL + "/v1", API: APISGLang, Model: "m", IgnoreEOS: true, HTTP: http.DefaultClient}
	res := c.Complete(context.Background(), []int{1, 2}, 3)
	if res.Err != nil {
		t.Fatal(res.Err)
	}
	for _, want := range []string{`"input_ids":[1,2]`, `"max_new_tokens":3`, `"ignore_eos":true`, `"stream":true`, `"temperature":0`} {
		if !strings.Contains(body, want) {
			t.Errorf("request %s lacks %s", body, want)
		}
	}
	if path != "/generate" || strings.Contains(body, `"model"`) || strings.Contains(body, `"prompt"`) {
		t.Errorf("asked %s with %s; want /generate with input_ids only", path, body)
	}
	if res.Text != "<17><5><9>" || res.Chunks != 2 || len(res.ITL) != 1 || res.TTFT == 0 {
		t.Errorf("text %q, chunks %d, ITL %d, ttft %v", res.Text, res.Chunks, len(res.ITL), res.TTFT)
	}
	if res.PromptTokens != 2 || res.CompletionTokens != 3 || res.CachedTokens != 1 {
		t.Errorf("usage %d/%d/%d; want 2/3/1", res.PromptTokens, res.CompletionTokens, res.CachedTokens)
	}
}

// TestClientRefusesSGLangStreamsItCannotRead: a stream of deltas
// (incremental_streaming_output on) or an error event fails the request with
// the reason; tokens are never dropped silently.
func TestClientRefusesSGLangStreamsItCannotRead(t *testing.T) {
	for _, tc := range []struct{ name, events, want string }{
		{"deltas", `{"output_ids":[17],"meta_info":{"completion_tokens":1}}` + "\n\ndata: " + `{"output_ids":[5],"meta_info":{"completion_tokens":2}}`, "do not extend"},
		{"error", `{"error":{"message":"context too long","code":400}}`, "context too long"},
		{"abort", `{"output_ids":[17],"meta_info":{"completion_tokens":1,"finish_reason":null}}` + "\n\ndata: " +
			`{"output_ids":[17],"meta_info":{"completion_tokens":1,"finish_reason":{"type":"abort","message":"memory pool exhausted","status_code":503}}}`, "aborted the request after 1 output tokens: memory pool exhausted"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				fmt.Fprint(w, "data: "+tc.events+"\n\ndata: [DONE]\n\n")
			}))
			defer srv.Close()
			c := &Client{Endpoint: srv.URL, API: APISGLang, HTTP: http.DefaultClient}
			if res := c.Complete(context.Background(), []int{1}, 2); res.Err == nil || !strings.Contains(res.Err.Error(), tc.want) {
				t.Fatalf("err %v; want it to mention %q", res.Err, tc.want)
			}
		})
	}
}

func readAll(r *http.Request) string {
	var b strings.Builder
	_, _ = io.Copy(&b, r.Body)
	return b.String()
}

// TestNoDeltaFromACounterThatWasNotANumber: a counter NaN in the first
// sample and finite in the last has no delta (not its whole value).
func TestNoDeltaFromACounterThatWasNotANumber(t *testing.T) {
	before, err := ParseMetrics(strings.NewReader("# TYPE a_total counter\na_total NaN\nb_total 2\n"))
	if err != nil {
		t.Fatal(err)
	}
	after, err := ParseMetrics(strings.NewReader("# TYPE a_total counter\na_total 5\nb_total 7\n"))
	if err != nil {
		t.Fatal(err)
	}
	w := Window{Before: before, After: after}
	w.Deltas()
	if _, ok := w.Delta["a_total"]; ok || w.Delta["b_total"] != 5 {
		t.Fatalf("deltas %v: want b_total 5 and none for a_total", w.Delta)
	}
}
