package main

import (
	"flag"
	"os"
	"strings"
	"testing"

	"github.com/orbitkv/orbitkv/fabric"
)

// TestEveryServeFlagIsDocumented keeps docs/configuration.md in step with
// the flags `orbitkv serve` registers.
func TestEveryServeFlagIsDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	cfg := fabric.DefaultConfig()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.RegisterFlags(fs)
	fs.String("log-level", "", "")
	n := 0
	fs.VisitAll(func(f *flag.Flag) {
		n++
		if !strings.Contains(string(doc), "`--"+f.Name+"`") {
			t.Errorf("flag --%s is not documented in docs/configuration.md", f.Name)
		}
	})
	if n < 10 {
		t.Fatalf("only %d flags registered", n)
	}
}
