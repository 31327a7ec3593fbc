package fabric

import (
	"context"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"net/http"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/orbitkv/orbitkv/internal/pagekey"
	pb "github.com/orbitkv/orbitkv/proto/orbitkv/v1"
)

// POST /v1/route on the metrics listener: the admin service's Route as
// JSON, for routers that speak HTTP (docs/cluster.md, "Routing by where KV
// lives", is the reference of the shape). This file is the JSON edge: the
// only place the route's JSON types meet the proto ones.

// routeBodyLimit bounds a request body: 1 M tokens as JSON numbers fit.
const routeBodyLimit = 16 << 20

// RouteQuery is the body of POST /v1/route: keys, or layout and tokens.
type RouteQuery struct {
	Keys   []string        `json:"keys,omitempty"`   // page keys, 32 hex digits each, in chain order
	Layout *pagekey.Layout `json:"layout,omitempty"` // the layout fingerprint's inputs
	Tokens []uint32        `json:"tokens,omitempty"`
}

// RouteAnswer is the answer: hosts with a leading run, best first.
type RouteAnswer struct {
	PromptPages int         `json:"prompt_pages"`
	Hosts       []RouteHost `json:"hosts"`
}

// RouteHost is one host of a RouteAnswer.
type RouteHost struct {
	Name      string     `json:"name"`
	Self      bool       `json:"self"`
	State     string     `json:"state"` // alive, suspect
	Pages     int        `json:"pages"` // leading pages held: 0..pages-1
	Runs      []RouteRun `json:"runs"`
	Confirmed bool       `json:"confirmed"`
	PeerAddr  string     `json:"peer_addr,omitempty"`
	DataAddr  string     `json:"data_addr,omitempty"`
}

// RouteRun is a stretch of leading pages in one tier: dram, ssd, or
// unknown (the host did not confirm).
type RouteRun struct {
	Tier  string `json:"tier"`
	Pages int    `json:"pages"`
}

// routeHandler serves POST /v1/route from route (engineapi.API.Route).
func routeHandler(route func(context.Context, *pb.RouteRequest) (*pb.RouteResponse, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var q RouteQuery
		dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, routeBodyLimit))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&q); err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": "decode route query: " + err.Error()})
			return
		}
		req, err := routeRequestOf(q)
		if err != nil {
			writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
			return
		}
		resp, err := route(r.Context(), req)
		if err != nil {
			code := http.StatusInternalServerError
			if status.Code(err) == codes.InvalidArgument {
				code = http.StatusBadRequest
			}
			writeJSON(w, code, map[string]string{"error": status.Convert(err).Message()})
			return
		}
		writeJSON(w, http.StatusOK, RouteAnswerOf(resp))
	})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

func routeRequestOf(q RouteQuery) (*pb.RouteRequest, error) {
	req := &pb.RouteRequest{Tokens: q.Tokens}
	for i, s := range q.Keys {
		k, err := hex.DecodeString(s)
		if err != nil {
			return nil, fmt.Errorf("key %d: %w", i, err)
		}
		req.Keys = append(req.Keys, k)
	}
	if l := q.Layout; l != nil {
		req.Layout = &pb.Layout{Model: l.Model, Revision: l.Revision, Dtype: l.DType, NumLayers: l.NumLayers, KvHeads: l.KVHeads,
			HeadDim: l.HeadDim, TpRank: l.TPRank, TpSize: l.TPSize, PageTokens: l.PageTokens, ByteLayout: l.ByteLayout}
	}
	return req, nil
}

// RouteAnswerOf is resp as JSON answers it (orbitkv route --json prints it).
func RouteAnswerOf(resp *pb.RouteResponse) RouteAnswer {
	out := RouteAnswer{PromptPages: int(resp.PromptPages), Hosts: []RouteHost{}}
	for _, h := range resp.Hosts {
		host := RouteHost{Name: h.Name, Self: h.Self, State: h.State, Pages: int(h.Pages), Confirmed: h.Confirmed,
			PeerAddr: h.PeerAddr, DataAddr: h.DataAddr, Runs: []RouteRun{}}
		for _, r := range h.Runs {
			host.Runs = append(host.Runs, RouteRun{Tier: routeTierName(r.Tier), Pages: int(r.Pages)})
		}
		out.Hosts = append(out.Hosts, host)
	}
	return out
}

func routeTierName(t pb.Tier) string {
	switch t {
	case pb.Tier_TIER_DRAM:
		return "dram"
	case pb.Tier_TIER_SSD:
		return "ssd"
	}
	return "unknown"
}
