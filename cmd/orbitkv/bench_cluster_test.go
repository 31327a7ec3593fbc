package main

import (
	"context"
	"io"
	"strings"
	"testing"
)

// TestBenchClusterRefusesBadFlags: bad flags get a message, before any
// peer is contacted.
func TestBenchClusterRefusesBadFlags(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"one peer", []string{"--sockets", "a", "--metrics", "m", "--pids", "1"}, "at least two peers"},
		{"lists differ", []string{"--sockets", "a,b", "--metrics", "m", "--pids", "1,2"}, "one of each per peer"},
		{"bad pid", []string{"--sockets", "a,b", "--metrics", "m,n", "--pids", "1,x"}, "not a process id"},
		{"no pages", []string{"--sockets", "a,b", "--metrics", "m,n", "--pids", "1,2", "--pages", "0"}, "must be positive"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := runBenchCluster(context.Background(), tc.args, io.Discard)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error with %q", err, tc.want)
			}
		})
	}
}
