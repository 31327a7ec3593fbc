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
	"strings"
	"time"
)

// Client sends streaming completions to an OpenAI-compatible endpoint.
type Client struct {
	Endpoint  string // base URL, e.g. http://127.0.0.1:8000 (…/v1 also accepted)
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
	return u + "/v1/completions"
}

// Complete streams one completion; ctx bounds the whole request. The result
// always carries the timings it got; Err says why it is incomplete.
func (c *Client) Complete(ctx context.Context, prompt []int, maxTokens int) Result {
	// return_token_ids (vLLM): a server started without a tokenizer streams
	// token ids and empty text; other servers ignore the field.
	body := map[string]any{"prompt": prompt, "max_tokens": maxTokens, "stream": true,
		"temperature": 0, "stream_options": map[string]any{"include_usage": true}, "return_token_ids": true}
	if c.Model != "" {
		body["model"] = c.Model
	}
	if c.IgnoreEOS {
		body["ignore_eos"] = true
	}
	buf, _ := json.Marshal(body)
	res := Result{Start: time.Now()}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url(), bytes.NewReader(buf))
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
	res.Err = readStream(resp.Body, &res)
	res.Latency = time.Since(res.Start)
	return res
}

var errNoDone = errors.New("stream ended without [DONE]")

// readStream consumes SSE events until [DONE], filling res.
func readStream(r io.Reader, res *Result) error {
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
				var ch streamChunk
				if jerr := json.Unmarshal(data, &ch); jerr != nil {
					return fmt.Errorf("bad SSE event %.80q: %v", data, jerr)
				}
				if ch.Error != nil {
					return fmt.Errorf("server error in stream: %s", ch.Error.Message)
				}
				if ch.Usage != nil {
					res.PromptTokens, res.CompletionTokens = ch.Usage.PromptTokens, ch.Usage.CompletionTokens
					res.RestoredTokens = ch.Usage.RestoredTokens
					if d := ch.Usage.PromptTokensDetails; d != nil {
						res.CachedTokens = d.CachedTokens
					}
				}
				if len(ch.Choices) > 0 && (ch.Choices[0].Text != "" || len(ch.Choices[0].TokenIDs) > 0) {
					if res.Chunks == 0 {
						res.TTFT = now.Sub(res.Start)
					} else {
						res.ITL = append(res.ITL, now.Sub(last))
					}
					last = now
					res.Chunks++
					writeOutput(&text, ch.Choices[0].Text, ch.Choices[0].TokenIDs)
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
