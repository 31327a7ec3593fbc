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
	fs := newServeFlags(&serveSettings{cfg: fabric.DefaultConfig()}, "serve")
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

// TestDocumentedConfigFileIsValid: the example config file in
// docs/configuration.md loads and validates.
func TestDocumentedConfigFileIsValid(t *testing.T) {
	doc, err := os.ReadFile("../../docs/configuration.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(doc)
	start := strings.Index(text, "```yaml\n")
	end := strings.Index(text[start+8:], "```")
	if start < 0 || end < 0 {
		t.Fatal("no yaml example in docs/configuration.md")
	}
	s, err := loadServeSettings("serve", []string{"--config", writeFile(t, text[start+8:start+8+end])})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if s.cfg.DRAMBytes != 64<<30 || s.cfg.SSDBytes != 1e12 {
		t.Fatalf("example read as dram %v ssd %v", s.cfg.DRAMBytes, s.cfg.SSDBytes)
	}
}
