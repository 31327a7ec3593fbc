package lint

import (
	"maps"
	"slices"
	"testing"
)

// backRefBudget is how many references may run back up each of the peer's
// packages' file graphs (refgraph_test.go; docs/architecture.md, "Measuring
// the walls"). The root's is issue 13's done-criterion; the wings' are
// their figures when they were split out, so they only go down.
var backRefBudget = map[string]int{
	"fabric":           3,
	"fabric/engineapi": 10,
	"fabric/store":     12,
	"fabric/cluster":   2,
}

// TestPeerReferenceGraph measures the peer's packages' file reference
// graphs and holds each to its budget; -v prints the figures and the back
// references:
//
//	go test -count=1 -run TestPeerReferenceGraph -v ./internal/lint
func TestPeerReferenceGraph(t *testing.T) {
	var paths []string
	for _, rel := range slices.Sorted(maps.Keys(backRefBudget)) {
		paths = append(paths, module+"/"+rel)
	}
	for _, g := range loadFileGraphs(t, paths...) {
		lay := g.layer()
		t.Log("\n" + g.report(lay))
		if budget := backRefBudget[rel(g.pkg)]; len(lay.back) > budget {
			t.Errorf("%s: %d references run back up its files, budget %d:\n%s", rel(g.pkg), len(lay.back), budget, g.report(lay))
		}
	}
}
