// Package memtouch loads one byte of every cache line of a buffer, so that a
// core about to read or overwrite it finds its lines nearer than DRAM (the
// TCP data plane's serve-side read-ahead and its client's destination
// warming, transfer/tcp). The loads are in assembly on amd64: they are
// hints, never results, so a buffer another goroutine or the kernel is
// writing may be touched without a data race the race detector would
// report (a Go load would be one: syscall.Read marks its buffer written).
package memtouch

// Line is the cache line the loads step by.
const Line = 64

// Lines loads one byte of every Line bytes of b and returns them summed (a
// value only so that nothing can drop the loads). Where there is no
// assembly version it does nothing: Supported says which.
func Lines(b []byte) byte {
	if len(b) == 0 {
		return 0
	}
	return lines(b)
}
