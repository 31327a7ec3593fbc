package router

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"sync/atomic"
	"time"
)

// Config is the router's configuration.
type Config struct {
	Peer         string            // the local peer's metrics address, host:port (its POST /v1/route)
	Engines      map[string]string // engine base URL by the peer member name of its host (serve --node-name)
	Layout       json.RawMessage   // the engines' layout, as /v1/route takes it (the fields of orbitkv.keys.Layout)
	RouteTimeout time.Duration     // deadline of one route query (0: 200 ms)
	// RoundRobin sends every request round robin and never asks the peer:
	// the baseline a routed run is measured against, and the proxy in front
	// of several engines of one host (their names are then only labels).
	RoundRobin bool
}

// Validate checks the config.
func (c *Config) Validate() error {
	var l map[string]any
	switch {
	case len(c.Engines) == 0:
		return errors.New("router: at least one engine is required")
	case c.RoundRobin:
		return nil
	case c.Peer == "":
		return errors.New("router: the peer's metrics address is required")
	case json.Unmarshal(c.Layout, &l) != nil:
		return errors.New("router: the layout must be a JSON object")
	}
	return nil
}

// Header names the router sets on every answer it forwards.
const (
	HeaderEngine = "X-Orbitkv-Engine" // the member name of the engine's host
	HeaderRoute  = "X-Orbitkv-Route"  // "routed N" (N leading pages held there) or "round-robin"
)

// maxBody bounds a request body.
const maxBody = 16 << 20

// Router is the proxy; it is an http.Handler.
type Router struct {
	cfg    Config
	names  []string // engine names, sorted: the round-robin order
	client *http.Client
	rr     atomic.Uint64
	// What the requests got, for Counts.
	routed, roundRobin, routeFailed atomic.Uint64
}

// Counts is how the router's requests went so far.
type Counts struct {
	Routed      uint64 // sent to a host holding a leading page
	RoundRobin  uint64 // sent round robin (nobody held a page, text prompt, or RoundRobin)
	RouteFailed uint64 // route queries that failed or ran out of time (their requests went round robin)
}

// Counts returns how the requests went so far.
func (r *Router) Counts() Counts {
	return Counts{Routed: r.routed.Load(), RoundRobin: r.roundRobin.Load(), RouteFailed: r.routeFailed.Load()}
}

// New returns a router over cfg's engines.
func New(cfg Config) (*Router, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.RouteTimeout <= 0 {
		cfg.RouteTimeout = 200 * time.Millisecond
	}
	r := &Router{cfg: cfg, client: &http.Client{}}
	for name := range cfg.Engines {
		r.names = append(r.names, name)
	}
	slices.Sort(r.names)
	return r, nil
}

// ServeHTTP routes POST /v1/completions; anything else is 404.
func (r *Router) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if req.Method != http.MethodPost || req.URL.Path != "/v1/completions" {
		http.Error(w, "the router serves POST /v1/completions", http.StatusNotFound)
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, req.Body, maxBody))
	if err != nil {
		http.Error(w, "read request: "+err.Error(), http.StatusBadRequest)
		return
	}
	var prompt struct {
		Prompt json.RawMessage `json:"prompt"`
	}
	_ = json.Unmarshal(body, &prompt)
	var tokens []uint32
	_ = json.Unmarshal(prompt.Prompt, &tokens) // text prompts are not keyed: round robin
	var ans Answer
	if len(tokens) > 0 && !r.cfg.RoundRobin {
		if ans, err = r.route(req.Context(), tokens); err != nil {
			r.routeFailed.Add(1)
		}
	}
	name, pages := pick(ans, r.cfg.Engines, r.names, r.rr.Add(1)-1)
	if pages > 0 {
		r.routed.Add(1)
	} else {
		r.roundRobin.Add(1)
	}
	r.forward(w, req, name, pages, body)
}

// forward sends body to engine name and copies its answer back.
func (r *Router) forward(w http.ResponseWriter, req *http.Request, name string, pages int, body []byte) {
	out, err := http.NewRequestWithContext(req.Context(), http.MethodPost, r.cfg.Engines[name]+"/v1/completions", bytes.NewReader(body))
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	out.Header.Set("Content-Type", "application/json")
	resp, err := r.client.Do(out)
	if err != nil {
		http.Error(w, fmt.Sprintf("engine %s: %v", name, err), http.StatusBadGateway)
		return
	}
	defer resp.Body.Close()
	for k, vs := range resp.Header {
		w.Header()[k] = vs
	}
	w.Header().Set(HeaderEngine, name)
	if pages > 0 {
		w.Header().Set(HeaderRoute, fmt.Sprintf("routed %d", pages))
	} else {
		w.Header().Set(HeaderRoute, "round-robin")
	}
	w.WriteHeader(resp.StatusCode)
	copyFlushing(w, resp.Body)
}

// copyFlushing copies an engine's answer as it comes: a streamed completion
// (server-sent events) reaches the client token by token, so its time to
// first token and inter-token latency are the engine's, not the proxy's buffer's.
func copyFlushing(w http.ResponseWriter, body io.Reader) {
	f, _ := w.(http.Flusher)
	buf := make([]byte, 32<<10)
	for {
		n, err := body.Read(buf)
		if n > 0 {
			if _, werr := w.Write(buf[:n]); werr != nil {
				return
			}
			if f != nil {
				f.Flush()
			}
		}
		if err != nil {
			return
		}
	}
}
