package store

import (
	"os"
	"strconv"
	"sync/atomic"
)

// A test-only hook that makes a restore deliver one wrong byte: with
// ORBITKV_TEST_CORRUPT_LOADS=N in the peer's environment, the first page of
// every Nth load (a chunk of a Load) gets one bit flipped in its DRAM copy
// before it is copied into the engine, past every checksum (DRAM pages are
// not verified on the way to an engine). It exists to show that an
// engine's output comparison catches a wrong restore (issue 11: a run
// whose reused prompts must match their serial reference). The bit is bit 6
// of the last byte of the page's first element (a bf16 or fp32 exponent
// bit): that value changes by many orders of magnitude. The start logs a
// warning while it is set; never set it on a peer that serves users.
const testCorruptEnv = "ORBITKV_TEST_CORRUPT_LOADS"

// testCorrupt is the hook's state; every is 0 when the hook is off.
type testCorrupt struct {
	every int64
	loads atomic.Int64
	done  atomic.Int64 // pages corrupted so far
}

// testCorruptFromEnv reads the hook's setting (0: off, also on a bad value).
func testCorruptFromEnv() int64 {
	n, err := strconv.ParseInt(os.Getenv(testCorruptEnv), 10, 64)
	if err != nil || n <= 0 {
		return 0
	}
	return n
}
