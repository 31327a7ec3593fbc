package lint

import (
	"encoding/json"
	"fmt"
	"go/ast"
	"go/importer"
	"go/parser"
	"go/token"
	"go/types"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
)

// The reference graph of a package's files (docs/architecture.md,
// "Measuring the walls"). Nodes are the package's non-test .go files; an
// edge a → b says that code in a uses a name declared in b: a package-level
// function, type, variable or constant, a method or a struct field
// (go/types' Uses, so x.f names the f that type checking resolved). The
// graph is layered by a depth-first search from the files in name order,
// each file's references in name order: a reference to a file still on the
// search's stack closes a cycle and is a back reference, "a reference
// running back up"; what is left is acyclic, and a file's level is the
// length of its longest chain of references down (0: it uses no other
// file). The back references are a feedback arc set: remove them and the
// files stack up; the fewer there are, the more the files read bottom-up.

// fileGraph is one package's file reference graph.
type fileGraph struct {
	pkg   string
	files []string       // base names, sorted
	edges map[[2]int]int // (from, to) file indexes → identifier uses
	out   map[int][]int  // from → to, sorted
}

// layering is a fileGraph stacked into levels.
type layering struct {
	levels int      // distinct levels (longest chain + 1)
	level  []int    // per file
	back   [][2]int // references running back up (from, to)
	sccs   [][]int  // strongly connected components of more than one file
}

// listedPkg is the part of `go list -export -deps -json` the loader reads.
type listedPkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Export     string
}

// loadFileGraphs type-checks the given packages from source, their
// dependencies from the build cache's export data, and returns each one's
// file graph.
func loadFileGraphs(t *testing.T, paths ...string) []*fileGraph {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-export", "-deps", "-json"}, paths...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -export: %v", err)
	}
	byPath := map[string]listedPkg{}
	dec := json.NewDecoder(strings.NewReader(string(out)))
	for {
		var p listedPkg
		if err := dec.Decode(&p); err == io.EOF {
			break
		} else if err != nil {
			t.Fatal(err)
		}
		byPath[p.ImportPath] = p
	}
	fset := token.NewFileSet()
	imp := importer.ForCompiler(fset, "gc", func(path string) (io.ReadCloser, error) {
		p, ok := byPath[path]
		if !ok || p.Export == "" {
			return nil, fmt.Errorf("no export data for %s", path)
		}
		return os.Open(p.Export)
	})
	var graphs []*fileGraph
	for _, path := range paths {
		p, ok := byPath[path]
		if !ok {
			t.Fatalf("go list did not list %s", path)
		}
		g, err := fileGraphOf(fset, imp, p)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		graphs = append(graphs, g)
	}
	return graphs
}

func fileGraphOf(fset *token.FileSet, imp types.Importer, p listedPkg) (*fileGraph, error) {
	g := &fileGraph{pkg: p.ImportPath, files: slices.Sorted(slices.Values(p.GoFiles)), edges: map[[2]int]int{}, out: map[int][]int{}}
	var syntax []*ast.File
	index := map[string]int{} // absolute file name → index
	for i, name := range g.files {
		full := filepath.Join(p.Dir, name)
		f, err := parser.ParseFile(fset, full, nil, parser.SkipObjectResolution)
		if err != nil {
			return nil, err
		}
		syntax = append(syntax, f)
		index[full] = i
	}
	info := &types.Info{Uses: map[*ast.Ident]types.Object{}}
	conf := types.Config{Importer: imp}
	if _, err := conf.Check(p.ImportPath, fset, syntax, info); err != nil {
		return nil, err
	}
	for id, obj := range info.Uses {
		if obj.Pkg() == nil || obj.Pkg().Path() != p.ImportPath || !obj.Pos().IsValid() {
			continue
		}
		if v, ok := obj.(*types.Var); ok && !v.IsField() && v.Parent() != obj.Pkg().Scope() {
			continue // a local variable or parameter
		}
		if _, ok := obj.(*types.Label); ok {
			continue
		}
		from, ok1 := index[fset.Position(id.Pos()).Filename]
		to, ok2 := index[fset.Position(obj.Pos()).Filename]
		if !ok1 || !ok2 || from == to {
			continue
		}
		g.edges[[2]int{from, to}]++
	}
	for e := range g.edges {
		g.out[e[0]] = append(g.out[e[0]], e[1])
	}
	for _, to := range g.out {
		sort.Ints(to)
	}
	return g, nil
}

// layer stacks the graph (see the comment at the top of this file).
func (g *fileGraph) layer() layering {
	order := g.order()
	pos := make([]int, len(g.files))
	for i, v := range order {
		pos[v] = i
	}
	var lay layering
	down := map[int][]int{} // the references that run down the order
	for _, v := range order {
		for _, w := range g.out[v] {
			if pos[w] > pos[v] {
				down[v] = append(down[v], w)
			} else {
				lay.back = append(lay.back, [2]int{v, w})
			}
		}
	}
	lay.level = make([]int, len(g.files))
	for i := len(order) - 1; i >= 0; i-- { // bottom up: every w below v is done
		v := order[i]
		for _, w := range down[v] {
			lay.level[v] = max(lay.level[v], lay.level[w]+1)
		}
		lay.levels = max(lay.levels, lay.level[v]+1)
	}
	lay.sccs = g.sccs()
	return lay
}

// order lists the files top (used by nobody) to bottom (using nobody) by
// the greedy feedback-arc-set heuristic of Eades, Lin and Smyth (1993):
// repeatedly take every file no remaining file uses to the top, every file
// that uses no remaining file to the bottom, and else the file whose
// remaining references out outnumber those in by the most (ties by name)
// to the top. The references that then run up the order are the back
// references; the heuristic keeps them few (finding the fewest is NP-hard)
// and is deterministic.
func (g *fileGraph) order() []int {
	n := len(g.files)
	in, out := make([]int, n), make([]int, n)
	users := map[int][]int{}
	for e := range g.edges {
		out[e[0]]++
		in[e[1]]++
		users[e[1]] = append(users[e[1]], e[0])
	}
	gone := make([]bool, n)
	remove := func(v int) {
		gone[v] = true
		for _, w := range g.out[v] {
			in[w]--
		}
		for _, u := range users[v] {
			out[u]--
		}
	}
	var top, bottom []int
	for left := n; left > 0; {
		progress := false
		for v := range n {
			if !gone[v] && out[v] == 0 {
				remove(v)
				bottom, left, progress = append(bottom, v), left-1, true
			}
		}
		for v := range n {
			if !gone[v] && in[v] == 0 {
				remove(v)
				top, left, progress = append(top, v), left-1, true
			}
		}
		if progress || left == 0 {
			continue
		}
		best := -1
		for v := range n {
			if !gone[v] && (best < 0 || out[v]-in[v] > out[best]-in[best]) {
				best = v
			}
		}
		remove(best)
		top, left = append(top, best), left-1
	}
	slices.Reverse(bottom)
	return append(top, bottom...)
}

// sccs returns the strongly connected components of more than one file
// (Tarjan), each sorted, for the report.
func (g *fileGraph) sccs() [][]int {
	n := len(g.files)
	idx, low := make([]int, n), make([]int, n)
	on := make([]bool, n)
	for i := range idx {
		idx[i] = -1
	}
	var stack []int
	var out [][]int
	next := 0
	var strong func(int)
	strong = func(v int) {
		idx[v], low[v] = next, next
		next++
		stack = append(stack, v)
		on[v] = true
		for _, w := range g.out[v] {
			if idx[w] < 0 {
				strong(w)
				low[v] = min(low[v], low[w])
			} else if on[w] {
				low[v] = min(low[v], idx[w])
			}
		}
		if low[v] != idx[v] {
			return
		}
		var c []int
		for {
			w := stack[len(stack)-1]
			stack = stack[:len(stack)-1]
			on[w] = false
			c = append(c, w)
			if w == v {
				break
			}
		}
		if len(c) > 1 {
			sort.Ints(c)
			out = append(out, c)
		}
	}
	for v := range n {
		if idx[v] < 0 {
			strong(v)
		}
	}
	return out
}

// report is the figures and the back references, one per line.
func (g *fileGraph) report(lay layering) string {
	var b strings.Builder
	rel := strings.TrimPrefix(strings.TrimPrefix(g.pkg, module), "/")
	fmt.Fprintf(&b, "%s: %d files on %d levels, %d references running back up\n", rel, len(g.files), lay.levels, len(lay.back))
	for _, e := range lay.back {
		fmt.Fprintf(&b, "  back: %s → %s (%d uses)\n", g.files[e[0]], g.files[e[1]], g.edges[e])
	}
	for _, c := range lay.sccs {
		names := make([]string, len(c))
		for i, v := range c {
			names[i] = g.files[v]
		}
		fmt.Fprintf(&b, "  cycle: %s\n", strings.Join(names, " "))
	}
	return b.String()
}
