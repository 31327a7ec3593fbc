package cluster

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestRunRefusesBadConfigs: a bad configuration gets a message before any
// peer is contacted.
func TestRunRefusesBadConfigs(t *testing.T) {
	ok := DefaultConfig()
	ok.Sockets, ok.Metrics, ok.PIDs = []string{"a", "b"}, []string{"m", "n"}, []int{1, 2}
	tests := []struct {
		name string
		edit func(*Config)
		want string
	}{
		{"one peer", func(c *Config) { c.Sockets, c.Metrics, c.PIDs = c.Sockets[:1], c.Metrics[:1], c.PIDs[:1] }, "at least two peers"},
		{"lists differ", func(c *Config) { c.Metrics = c.Metrics[:1] }, "one of each per peer"},
		{"no pages", func(c *Config) { c.Pages = 0 }, "must be positive"},
		{"no batch", func(c *Config) { c.Batch = 0 }, "must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg := ok
			tc.edit(&cfg)
			err := Run(context.Background(), cfg, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
