package lint

import (
	"encoding/json"
	"io"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "github.com/orbitkv/orbitkv"

// pkg is the part of `go list -json` these checks read.
type pkg struct {
	ImportPath                string
	Doc                       string
	Imports                   []string
	Deps                      []string // every package it imports, directly or not
	TestImports, XTestImports []string
	CgoFiles                  []string
	GoFiles                   []string
}

func listPackages(t *testing.T) []pkg {
	t.Helper()
	cmd := exec.Command("go", "list", "-json", module+"/...")
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	var pkgs []pkg
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p pkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 10 {
		t.Fatalf("go list found only %d packages", len(pkgs))
	}
	return pkgs
}

// layer of a project package: imports may only point to lower layers
// (DESIGN.md §4: cmd → fabric → {catalog, tiers, transfer} → {rdma, cuda,
// proto, internal}). The benchmarks (bench/, issue 35) sit between cmd,
// which wires their flags, and fabric, which they measure.
func layer(rel string) int {
	top, _, _ := strings.Cut(rel, "/")
	switch top {
	case "integration":
		return 6
	case "cmd":
		return 5
	case "bench":
		return 4
	case "fabric":
		return 3
	case "catalog", "tiers", "transfer":
		return 2
	case "rdma", "cuda", "proto", "internal":
		return 1
	}
	return -1
}

func rel(path string) string { return strings.TrimPrefix(strings.TrimPrefix(path, module), "/") }

func top(rel string) string { t, _, _ := strings.Cut(rel, "/"); return t }

// allowedSideways are imports within one layer that DESIGN.md permits.
var allowedSideways = map[[2]string]bool{
	{"transfer", "tiers"}: true, // transfer may import tiers
	{"cuda", "internal"}:  true,
	{"rdma", "internal"}:  true,
	// internal/engineclient, the engine client of tests and benches
	// (DESIGN.md §4), speaks the engine API.
	{"internal", "proto"}: true,
}

func TestImportLayers(t *testing.T) {
	for _, p := range listPackages(t) {
		from := rel(p.ImportPath)
		lf := layer(from)
		if lf < 0 {
			t.Errorf("%s: package outside the layout of DESIGN.md §4", from)
			continue
		}
		for _, imp := range p.Imports {
			if !strings.HasPrefix(imp, module+"/") {
				continue
			}
			to := rel(imp)
			lt := layer(to)
			switch {
			case top(from) == top(to):
				// subpackages of one folder may use each other
			case lt < lf:
			case lt == lf && allowedSideways[[2]string{top(from), top(to)}]:
			default:
				t.Errorf("%s imports %s: arrows must point down (DESIGN.md §4)", from, to)
			}
		}
	}
}

func TestProtoStopsAtTheRPCEdge(t *testing.T) {
	for _, p := range listPackages(t) {
		from := rel(p.ImportPath)
		switch top(from) {
		case "catalog", "tiers", "transfer":
			for _, imp := range p.Imports {
				if strings.HasPrefix(imp, module+"/proto") || strings.Contains(imp, "cockroachdb/pebble") && top(from) != "catalog" ||
					strings.Contains(imp, "hashicorp/memberlist") {
					t.Errorf("%s imports %s: generated and third-party store types stay at their edge", from, imp)
				}
			}
		}
	}
}

func TestCgoOnlyInRdmaAndCuda(t *testing.T) {
	for _, p := range listPackages(t) {
		if len(p.CgoFiles) == 0 {
			continue
		}
		if dir := top(rel(p.ImportPath)); dir != "rdma" && dir != "cuda" {
			t.Errorf("%s uses cgo (%v): import \"C\" belongs in rdma/ and cuda/ only", rel(p.ImportPath), p.CgoFiles)
		}
	}
}

func TestEveryPackageHasADocComment(t *testing.T) {
	for _, p := range listPackages(t) {
		if strings.TrimSpace(p.Doc) == "" {
			t.Errorf("%s has no package doc comment", rel(p.ImportPath))
		}
	}
}

// apartWings are the peer's wings that never import each other, directly
// or through another package, tests included (DESIGN.md §4): the store
// reaches members through its own Members interface, and the peer wires
// the cluster into it.
var apartWings = [][2]string{{"fabric/store", "fabric/cluster"}, {"fabric/cluster", "fabric/store"}}

func TestStoreAndClusterApart(t *testing.T) {
	checked := 0
	for _, p := range listPackages(t) {
		from := rel(p.ImportPath)
		for _, w := range apartWings {
			if !within(from, w[0]) {
				continue
			}
			checked++
			for _, imp := range slices.Concat(p.Deps, p.TestImports, p.XTestImports) {
				if strings.HasPrefix(imp, module+"/") && within(rel(imp), w[1]) {
					t.Errorf("%s imports %s: %s and %s never import each other (DESIGN.md §4)", from, rel(imp), w[0], w[1])
				}
			}
		}
	}
	if checked < 2 {
		t.Fatalf("found %d of the wings %v", checked, apartWings)
	}
}

// within reports whether package path rel is dir or below it.
func within(rel, dir string) bool { return rel == dir || strings.HasPrefix(rel, dir+"/") }
