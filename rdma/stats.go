package rdma

import "sync/atomic"

// Stats are an engine's counters since Open, for the peer's metrics
// (orbitkv_rdma_*): this package logs nothing and exports nothing itself.
type Stats struct {
	Batches          uint64 // Read and Write calls
	BytesRead        uint64 // bytes of ops that READ successfully
	BytesWritten     uint64 // bytes of ops that WROTE successfully
	OpsFailed        uint64 // ops that ended with an error
	ErrorCompletions uint64 // work completions with an error status (flushes excluded)
	Timeouts         uint64 // batches that reached their deadline with work in flight
	Reconnects       uint64 // lanes reset and reconnected after an error
	QPsDestroyed     uint64 // QPs destroyed because they would not drain
}

type counters struct {
	batches, bytesRead, bytesWritten, opsFailed   atomic.Uint64
	errCompletions, timeouts, reconnects, qpsLost atomic.Uint64
}

// Stats returns the counters.
func (e *Engine) Stats() Stats {
	c := &e.stats
	return Stats{
		Batches: c.batches.Load(), BytesRead: c.bytesRead.Load(), BytesWritten: c.bytesWritten.Load(),
		OpsFailed: c.opsFailed.Load(), ErrorCompletions: c.errCompletions.Load(), Timeouts: c.timeouts.Load(),
		Reconnects: c.reconnects.Load(), QPsDestroyed: c.qpsLost.Load(),
	}
}

// count adds a finished batch's ops to the counters.
func (c *counters) count(op opcode, ops []Op, errs []error) {
	c.batches.Add(1)
	for i, o := range ops {
		switch {
		case errs[i] != nil:
			c.opsFailed.Add(1)
		case op == opRead:
			c.bytesRead.Add(o.Len())
		default:
			c.bytesWritten.Add(o.Len())
		}
	}
}
