package sim

import "fmt"

// Router picks the host that serves a request.
type Router string

// Routers.
const (
	// RoundRobin sends the i-th request to host i mod N.
	RoundRobin Router = "round-robin"
	// LeastLoaded sends a request to the host with the least estimated
	// work ahead of it.
	LeastLoaded Router = "least-loaded"
	// PrefixAffinity sends a request to the host with the least estimated
	// TTFT: work ahead plus prefill of the tokens it does not hold locally
	// (HBM, DRAM or SSD). It prefers the host holding the longest prefix
	// unless that host is busier than the prefix is worth.
	PrefixAffinity Router = "prefix-affinity"
)

// Routers lists the accepted routers.
var Routers = []Router{RoundRobin, LeastLoaded, PrefixAffinity}

func (r Router) policy() (Router, error) {
	for _, k := range Routers {
		if r == k {
			return r, nil
		}
	}
	return "", fmt.Errorf("router %q: want one of %v", string(r), Routers)
}

// needsPrefix reports whether Pick reads HostView.CachedTokens.
func (r Router) needsPrefix() bool { return r == PrefixAffinity }

// HostView is what a router sees of one host when a request arrives.
type HostView struct {
	AheadNs      int64 // estimated work before a new request could start, ns
	CachedTokens int64 // tokens of the request's prefix held locally (prefix-affinity only)
}

// Pick returns the host for the seq-th request (from 0) of inputTokens
// tokens. Ties go to the lowest host index. It is a pure function.
func (r Router) Pick(seq int, inputTokens int64, views []HostView, cost CostModel) int {
	switch r {
	case LeastLoaded:
		return argmin(views, func(v HostView) int64 { return v.AheadNs })
	case PrefixAffinity:
		return argmin(views, func(v HostView) int64 {
			return v.AheadNs + cost.PrefillNs(inputTokens-v.CachedTokens)
		})
	}
	return seq % len(views)
}

func argmin(views []HostView, score func(HostView) int64) int {
	best, bestScore := 0, score(views[0])
	for i, v := range views[1:] {
		if s := score(v); s < bestScore {
			best, bestScore = i+1, s
		}
	}
	return best
}
