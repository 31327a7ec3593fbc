package transfer

import (
	"fmt"
	"io"
	"runtime"
	"strings"
	"sync"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
)

// The memory beside the link: a fetch reads its source pages and writes
// its destination from and to memory that is mostly out of the caches,
// where iperf3 sends and receives one small buffer that stays in them.
// How fast this side's CPUs copy buffers too large for the caches, with one
// thread and with several at once, says whether the memory, shared by all
// connections, can be what holds them.

// memCopyBytes is each thread's buffer: far past any L3 here.
const memCopyBytes = 256 << 20

// memCopyRate copies memCopyBytes between two buffers of its own on each of
// threads goroutines for about d, all at once, and returns the bytes
// copied per second over all of them, in GB/s.
func memCopyRate(threads int, d time.Duration) float64 {
	src, dst := make([][]byte, threads), make([][]byte, threads)
	for i := range threads {
		src[i], dst[i] = poolMemory(memCopyBytes), poolMemory(memCopyBytes)
	}
	defer func() {
		for i := range threads {
			unmapPool(src[i])
			unmapPool(dst[i])
		}
	}()
	var wg sync.WaitGroup
	copied := make([]int, threads)
	start := time.Now()
	for i := range threads {
		wg.Go(func() {
			for time.Since(start) < d {
				copied[i] += copy(dst[i], src[i])
			}
		})
	}
	wg.Wait()
	total := 0
	for _, n := range copied {
		total += n
	}
	return benchutil.Gbps(uint64(total), time.Since(start))
}

// printMemCopy writes this side's copy rates for 1, 2, 4, … threads up to
// threads itself, at most GOMAXPROCS.
func printMemCopy(out io.Writer, threads int) {
	limit := max(1, min(threads, runtime.GOMAXPROCS(0)))
	var parts []string
	for t := 1; ; t = min(2*t, limit) {
		parts = append(parts, fmt.Sprintf("%d thread(s) %.1f GB/s", t, memCopyRate(t, 300*time.Millisecond)))
		if t == limit {
			break
		}
	}
	fmt.Fprintf(out, "memory: copies of %d-MiB buffers on this side (the client's), all at once: %s\n", memCopyBytes>>20, strings.Join(parts, ", "))
}
