package cluster

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"github.com/orbitkv/orbitkv/catalog"
)

// TestRunScaleTiny: a tiny curve of real members on loopback converges,
// finds the other member's chain, and prints the model beside it.
func TestRunScaleTiny(t *testing.T) {
	for _, compact := range []bool{false, true} {
		cfg := DefaultScaleConfig()
		cfg.Hosts, cfg.Pages, cfg.Compact = []int{2, 3}, []int{64}, compact
		cfg.Window, cfg.Probes, cfg.Lookups, cfg.Churn = 200*time.Millisecond, 2, 10, 4
		var out bytes.Buffer
		if err := RunScale(context.Background(), cfg, &out); err != nil {
			t.Fatalf("compact %v: %v\n%s", compact, err, out.String())
		}
		for _, want := range []string{"3 hosts × 64 pages", "(32/32 found)", "model at 1000 hosts × 100000 pages"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("compact %v: output lacks %q:\n%s", compact, want, out.String())
			}
		}
	}
}

func TestScaleConfigRefusesBadInput(t *testing.T) {
	for name, edit := range map[string]func(*ScaleConfig){
		"one host":      func(c *ScaleConfig) { c.Hosts = []int{1} },
		"past origins":  func(c *ScaleConfig) { c.Hosts = []int{catalog.MaxOrigins + 1} },
		"pages < chain": func(c *ScaleConfig) { c.Pages = []int{8} },
		"no churn":      func(c *ScaleConfig) { c.Churn = 0 },
	} {
		cfg := DefaultScaleConfig()
		edit(&cfg)
		if cfg.Validate() == nil {
			t.Errorf("%s: accepted", name)
		}
	}
	if _, err := ParseInts("10,x"); err == nil {
		t.Error("ParseInts accepted x")
	}
	if got, err := ParseInts("1e4, 10_000"); err != nil || got[0] != 10000 || got[1] != 10000 {
		t.Errorf("ParseInts: %v %v", got, err)
	}
}

func TestFitLine(t *testing.T) {
	a, b := fitLine([]float64{1, 2, 3}, []float64{3, 5, 7})
	if a != 1 || b != 2 {
		t.Errorf("fitLine: %v + %v x, want 1 + 2x", a, b)
	}
	if a, b := fitLine([]float64{4, 4}, []float64{1, 3}); a != 2 || b != 0 {
		t.Errorf("fitLine of one x: %v + %v x, want 2 + 0x", a, b)
	}
}
