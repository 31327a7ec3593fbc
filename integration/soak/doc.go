// Package soak holds the soak test (make soak, issue 34): one peer on its own
// and a 3-peer cluster in network namespaces run for a set time under mixed
// saves, loads, lookups with leases and evictions, engine processes killed
// mid-operation, peers killed with SIGKILL and restarted on their data
// directories and partitions between the namespaces. Every 10 s it samples
// each peer's RSS, goroutines, open fds, mapped regions and gauges; it fails
// on growth past the bounds in the resources table in sample_test.go, on any loaded byte that
// differs from what was saved, on any acknowledged SSD page lost across a
// kill, and on any operation that outlives its deadline. TestSoak runs only
// with ORBITKV_SOAK set to a duration (docs/operations.md, "Soak").
package soak
