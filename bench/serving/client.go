package serving

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"time"
)

// The APIs a Client speaks.
const (
	APIOpenAI = "openai" // POST /v1/completions, OpenAI's streamed completions (vLLM, SGLang, reference engine)
	// APISGLang is SGLang's native POST /generate with input_ids. A server
	// started with --skip-tokenizer-init has no text to put in its OpenAI
	// routes' answers (SGLang 0.5.17 fails them with KeyError 'text'); its
	// /generate streams the output ids.
	APISGLang = "sglang"
)

// Client sends streaming completions to an engine's HTTP endpoint.
type Client struct {
	Endpoint  string // base URL, e.g. http://127.0.0.1:8000 (…/v1 also accepted)
	API       string // APIOpenAI (also when empty) or APISGLang
	Model     string // "model" field; empty leaves it out
	IgnoreEOS bool   // ask for exactly max_tokens (vLLM/SGLang extension)
	HTTP      *http.Client
}

// Result is what one streamed completion measured.
type Result struct {
	Start            time.Time
	TTFT             time.Duration   // to the first non-empty text; 0 if none came
	ITL              []time.Duration // gaps between successive non-empty text chunks
	Latency          time.Duration   // to the end of the stream
	Text             string
	Chunks           int // non-empty text chunks
	PromptTokens     int // from usage, when the server sends it
	CompletionTokens int
	CachedTokens     int // usage.prompt_tokens_details.cached_tokens
	RestoredTokens   int // usage.orbitkv_restored_tokens (reference engine)
	Err              error
}

type streamChunk struct {
	Choices []struct {
		Text         string  `json:"text"`
		TokenIDs     []int   `json:"token_ids"` // vLLM's return_token_ids extension
		FinishReason *string `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens        int `json:"prompt_tokens"`
		CompletionTokens    int `json:"completion_tokens"`
		PromptTokensDetails *struct {
			CachedTokens int `json:"cached_tokens"`
		} `json:"prompt_tokens_details"`
		RestoredTokens int `json:"orbitkv_restored_tokens"`
	} `json:"usage"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (c *Client) url() string {
	u := strings.TrimRight(c.Endpoint, "/")
	u = strings.TrimSuffix(u, "/v1")
	if c.API == APISGLang {
		return u + "/generate"
	}
	return u + "/v1/completions"
}

// body is one request's JSON for c.API.
func (c *Client) body(prompt []int, maxTokens int) []byte {
	var body map[string]any
	if c.API == APISGLang {
		sp := map[string]any{"max_new_tokens": maxTokens, "temperature": 0}
		if c.IgnoreEOS {
			sp["ignore_eos"] = true
		}
		body = map[string]any{"input_ids": prompt, "sampling_params": sp, "stream": true}
	} else {
		// return_token_ids (vLLM): a server started without a tokenizer streams
		// token ids and empty text; other servers ignore the field.
		body = map[string]any{"prompt": prompt, "max_tokens": maxTokens, "stream": true,
			"temperature": 0, "stream_options": map[string]any{"include_usage": true}, "return_token_ids": true}
		if c.IgnoreEOS {
			body["ignore_eos"] = true
		}
		if c.Model != "" {
			body["model"] = c.Model
		}
	}
	buf, _ := json.Marshal(body)
	return buf
}

// Complete streams one completion; ctx bounds the whole request. The result
// always carries the timings it got; Err says why it is incomplete.
func (c *Client) Complete(ctx context.Context, prompt []int, maxTokens int) Result {
	res := Result{Start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(), bytes.NewReader(c.body(prompt, maxTokens)))
	if err != nil {
		res.Err = err
		return res
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := c.HTTP.Do(req)
	if err != nil {
		res.Err = fmt.Errorf("post completion: %w", err)
		res.Latency = time.Since(res.Start)
		return res
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 2048))
		res.Err = fmt.Errorf("completion: HTTP %d: %s", resp.StatusCode, bytes.TrimSpace(msg))
		res.Latency = time.Since(res.Start)
		return res
	}
	dec := decodeOpenAI
	if c.API == APISGLang {
		dec = (&sglangDecoder{}).decode
	}
	res.Err = readStream(resp.Body, &res, dec)
	res.Latency = time.Since(res.Start)
	return res
}

var errNoDone = errors.New("stream ended without [DONE]")

// event is what one SSE event of a completion carried.
type event struct {
	text  string // new text
	ids   []int  // new token ids, when the server streams ids (no tokenizer)
	usage *usage // token counts, when the event has them
}

type usage struct{ prompt, completion, cached, restored int }

// decoder turns one SSE event's data into an event, or the server's error.
type decoder func(data []byte) (event, error)

func decodeOpenAI(data []byte) (event, error) {
	var ch streamChunk
	if err := json.Unmarshal(data, &ch); err != nil {
		return event{}, fmt.Errorf("bad SSE event %.80q: %v", data, err)
	}
	if ch.Error != nil {
		return event{}, fmt.Errorf("server error in stream: %s", ch.Error.Message)
	}
	var ev event
	if u := ch.Usage; u != nil {
		ev.usage = &usage{prompt: u.PromptTokens, completion: u.CompletionTokens, restored: u.RestoredTokens}
		if d := u.PromptTokensDetails; d != nil {
			ev.usage.cached = d.CachedTokens
		}
	}
	if len(ch.Choices) > 0 {
		ev.text, ev.ids = ch.Choices[0].Text, ch.Choices[0].TokenIDs
	}
	return ev, nil
}

// sglangDecoder reads SGLang's /generate stream. With SGLang's default
// (incremental_streaming_output off) each event holds every output id so far;
// the decoder passes on the new ones and checks that the earlier ones did not
// change, so a server streaming deltas instead fails the request rather than
// losing tokens.
type sglangDecoder struct{ ids []int }

type sglangChunk struct {
	OutputIDs []int `json:"output_ids"`
	MetaInfo  *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
		CachedTokens     int `json:"cached_tokens"`
		// FinishReason is null until the end; SGLang streams a request its
		// scheduler aborted (HTTP 400/500/503 inside) as an ordinary event
		// whose reason has type "abort", then [DONE].
		FinishReason *struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"finish_reason"`
	} `json:"meta_info"`
	Error *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func (d *sglangDecoder) decode(data []byte) (event, error) {
	var ch sglangChunk
	if err := json.Unmarshal(data, &ch); err != nil {
		return event{}, fmt.Errorf("bad SSE event %.80q: %v", data, err)
	}
	if ch.Error != nil {
		return event{}, fmt.Errorf("server error in stream: %s", ch.Error.Message)
	}
	var ev event
	if m := ch.MetaInfo; m != nil {
		if f := m.FinishReason; f != nil && f.Type == "abort" {
			return event{}, fmt.Errorf("SGLang aborted the request after %d output tokens: %s", m.CompletionTokens, f.Message)
		}
		ev.usage = &usage{prompt: m.PromptTokens, completion: m.CompletionTokens, cached: m.CachedTokens}
	}
	if len(ch.OutputIDs) < len(d.ids) || !slices.Equal(ch.OutputIDs[:len(d.ids)], d.ids) {
		return event{}, fmt.Errorf("SGLang stream: output ids %v do not extend the %v before them (is incremental_streaming_output on?)", ch.OutputIDs, d.ids)
	}
	ev.ids = ch.OutputIDs[len(d.ids):]
	d.ids = append(d.ids, ev.ids...)
	return ev, nil
}

// readStream consumes SSE events until [DONE], filling res.
func readStream(r io.Reader, res *Result, dec decoder) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var text strings.Builder
	defer func() { res.Text = text.String() }()
	var last time.Time
	for {
		line, err := br.ReadBytes('\n')
		if len(line) > 0 {
			now := time.Now()
			data, ok := bytes.CutPrefix(bytes.TrimRight(line, "\r\n"), []byte("data:"))
			if ok {
				data = bytes.TrimSpace(data)
				if string(data) == "[DONE]" {
					return nil
				}
				ev, derr := dec(data)
				if derr != nil {
					return derr
				}
				if u := ev.usage; u != nil {
					res.PromptTokens, res.CompletionTokens, res.CachedTokens, res.RestoredTokens = u.prompt, u.completion, u.cached, u.restored
				}
				if ev.text != "" || len(ev.ids) > 0 {
					if res.Chunks == 0 {
						res.TTFT = now.Sub(res.Start)
					} else {
						res.ITL = append(res.ITL, now.Sub(last))
					}
					last = now
					res.Chunks++
					writeOutput(&text, ev.text, ev.ids)
				}
			}
		}
		if err == io.EOF {
			return errNoDone
		}
		if err != nil {
			return fmt.Errorf("read stream: %w", err)
		}
	}
}

// writeOutput appends a chunk's output: its text, or, when a server without
// a tokenizer streams token ids and no text, the ids as "<id>" (so outputs
// still compare token for token).
func writeOutput(b *strings.Builder, text string, ids []int) {
	if text != "" {
		b.WriteString(text)
		return
	}
	for _, id := range ids {
		fmt.Fprintf(b, "<%d>", id)
	}
}
