package lint

import (
	"go/ast"
	"go/parser"
	"go/scanner"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// cmdDir is the binary's main package, seen from this package's directory.
var cmdDir = filepath.Join("..", "..", "cmd", "orbitkv")

// cmdLineBudget is how many lines of code (non-blank, non-comment lines of
// non-test .go files) cmd/orbitkv's main package may hold. Issue 35's
// target is 1,500: flags → config → package → Run, and help. Until every
// benchmark has moved to bench/, the budget is the figure after the last
// move, so it only goes down: lower it with each move, never raise it.
const cmdLineBudget = 3200

// benchFilesToMove are the bench_*.go files of cmd/orbitkv that still hold
// benchmark logic (issue 35). The list only shrinks: a file that leaves
// must leave it too; no file joins it.
var benchFilesToMove = []string{
	"bench_fabric.go",
	"bench_transfer.go", "bench_transfer_baseline.go", "bench_transfer_cpu.go", "bench_transfer_cpus.go",
	"bench_transfer_mem.go", "bench_transfer_netns.go", "bench_transfer_rdma.go", "bench_transfer_stream.go",
}

// TestCmdStaysThin holds cmd/orbitkv to wiring: its main package within
// cmdLineBudget lines of code, and its bench*.go files (beside the ones
// still to move) declaring nothing but runBench* functions, each a flag set
// handed to a bench package's Run, and the register*Flags they share.
func TestCmdStaysThin(t *testing.T) {
	files, err := filepath.Glob(filepath.Join(cmdDir, "*.go"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no Go files in %s (%v)", cmdDir, err)
	}
	total := 0
	for _, f := range files {
		name := filepath.Base(f)
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		total += codeLines(t, f, src)
		if strings.HasPrefix(name, "bench") && !slices.Contains(benchFilesToMove, name) {
			for _, decl := range benchLogic(t, f, src) {
				t.Errorf("%s: %s is benchmark logic: it belongs in a package under bench/, cmd wires flags to its Run", name, decl)
			}
		}
	}
	t.Logf("cmd/orbitkv: %d lines of code, budget %d (target 1,500)", total, cmdLineBudget)
	if total > cmdLineBudget {
		t.Errorf("cmd/orbitkv's main package has %d lines of code, budget %d: move the logic into the package it wires", total, cmdLineBudget)
	}
	for _, name := range benchFilesToMove {
		if _, err := os.Stat(filepath.Join(cmdDir, name)); err != nil {
			t.Errorf("%s has moved: take it off benchFilesToMove and lower cmdLineBudget to %d", name, total)
		}
	}
}

// codeLines counts the lines of src that hold a token other than a comment.
func codeLines(t *testing.T, name string, src []byte) int {
	fset := token.NewFileSet()
	file := fset.AddFile(name, -1, len(src))
	var s scanner.Scanner
	s.Init(file, src, func(pos token.Position, msg string) { t.Errorf("%s: %s", pos, msg) }, 0)
	lines := map[int]bool{}
	for {
		pos, tok, lit := s.Scan()
		if tok == token.EOF {
			break
		}
		if tok == token.SEMICOLON && lit == "\n" {
			continue // an inserted semicolon: it shares its line with a token already counted
		}
		lines[file.Line(pos)] = true
	}
	return len(lines)
}

// benchLogic lists what a bench*.go file of cmd declares beyond flag
// wiring: any type, variable or constant, and any function not named
// runBench* (a subcommand) or register*Flags (its flag set).
func benchLogic(t *testing.T, name string, src []byte) []string {
	f, err := parser.ParseFile(token.NewFileSet(), name, src, parser.SkipObjectResolution)
	if err != nil {
		t.Fatal(err)
	}
	var logic []string
	for _, d := range f.Decls {
		switch d := d.(type) {
		case *ast.FuncDecl:
			n := d.Name.Name
			if d.Recv != nil || !strings.HasPrefix(n, "runBench") && !(strings.HasPrefix(n, "register") && strings.HasSuffix(n, "Flags")) {
				logic = append(logic, "func "+d.Name.Name)
			}
		case *ast.GenDecl:
			if d.Tok == token.IMPORT {
				continue
			}
			for _, sp := range d.Specs {
				switch sp := sp.(type) {
				case *ast.TypeSpec:
					logic = append(logic, "type "+sp.Name.Name)
				case *ast.ValueSpec:
					for _, n := range sp.Names {
						logic = append(logic, d.Tok.String()+" "+n.Name)
					}
				}
			}
		}
	}
	return logic
}
