package lint

import "testing"

func TestPeerReferenceGraph(t *testing.T) {
	for _, g := range loadFileGraphs(t, module+"/fabric") {
		lay := g.layer()
		t.Log("\n" + g.report(lay))
		inSCC := 0
		for e := range g.edges {
			for _, c := range lay.sccs {
				a, b := false, false
				for _, v := range c {
					a = a || v == e[0]
					b = b || v == e[1]
				}
				if a && b {
					inSCC++
				}
			}
		}
		t.Logf("edges %d, edges inside cycles %d", len(g.edges), inSCC)
	}
}
