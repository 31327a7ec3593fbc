package router

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
)

// Answer is the part of POST /v1/route's answer the router reads.
type Answer struct {
	PromptPages int    `json:"prompt_pages"`
	Hosts       []Host `json:"hosts"`
}

// Host is one ranked host of an Answer.
type Host struct {
	Name  string `json:"name"`
	State string `json:"state"`
	Pages int    `json:"pages"`
}

// route asks the peer where the prompt's leading pages are.
func (r *Router) route(ctx context.Context, tokens []uint32) (Answer, error) {
	ctx, cancel := context.WithTimeout(ctx, r.cfg.RouteTimeout)
	defer cancel()
	q, err := json.Marshal(map[string]any{"layout": r.cfg.Layout, "tokens": tokens})
	if err != nil {
		return Answer{}, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+r.cfg.Peer+"/v1/route", bytes.NewReader(q))
	if err != nil {
		return Answer{}, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(req)
	if err != nil {
		return Answer{}, fmt.Errorf("route: %w", err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return Answer{}, fmt.Errorf("route: HTTP %d: %s", resp.StatusCode, raw)
	}
	var a Answer
	if err := json.Unmarshal(raw, &a); err != nil {
		return Answer{}, fmt.Errorf("route: %w", err)
	}
	return a, nil
}

// pick chooses the engine for a request: the first host of the ranked
// answer that holds a leading page, is alive and has an engine here; else
// names[rr % len(names)]. It returns the engine's name and how many leading
// pages its host holds (0: round robin).
func pick(a Answer, engines map[string]string, names []string, rr uint64) (string, int) {
	for _, h := range a.Hosts {
		if _, ok := engines[h.Name]; ok && h.Pages > 0 && h.State == "alive" {
			return h.Name, h.Pages
		}
	}
	return names[rr%uint64(len(names))], 0
}
