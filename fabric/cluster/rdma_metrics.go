package cluster

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	ibv "github.com/orbitkv/orbitkv/rdma"
)

// rdmaStat is one of the engine's counters (ibv.Stats) as a metric:
// orbitkv_rdma_<name>.
type rdmaStat struct {
	name, help string
	get        func(ibv.Stats) uint64
	desc       *prometheus.Desc
}

// rdmaCollector exports the RDMA engine's counters, read at each scrape
// (the engine counts; the rdma package exports nothing itself). Nothing is
// exported before an engine opened, or where none did.
type rdmaCollector struct {
	eng   *atomic.Pointer[ibv.Engine]
	stats []rdmaStat
}

func newRDMACollector(eng *atomic.Pointer[ibv.Engine]) *rdmaCollector {
	stats := []rdmaStat{
		{name: "batches_total", help: "RDMA READ and WRITE batches (Conn.Read and Conn.Write calls).", get: func(s ibv.Stats) uint64 { return s.Batches }},
		{name: "read_bytes_total", help: "Bytes of ops that RDMA READ moved successfully.", get: func(s ibv.Stats) uint64 { return s.BytesRead }},
		{name: "written_bytes_total", help: "Bytes of ops that RDMA WRITE moved successfully.", get: func(s ibv.Stats) uint64 { return s.BytesWritten }},
		{name: "failed_ops_total", help: "RDMA ops that ended with an error.", get: func(s ibv.Stats) uint64 { return s.OpsFailed }},
		{name: "error_completions_total", help: "Work completions with an error status (flushes excluded).", get: func(s ibv.Stats) uint64 { return s.ErrorCompletions }},
		{name: "timeouts_total", help: "Batches that reached their deadline with work in flight.", get: func(s ibv.Stats) uint64 { return s.Timeouts }},
		{name: "reconnects_total", help: "Lanes reset and reconnected after an error.", get: func(s ibv.Stats) uint64 { return s.Reconnects }},
		{name: "qps_destroyed_total", help: "Queue pairs destroyed because they would not drain.", get: func(s ibv.Stats) uint64 { return s.QPsDestroyed }},
	}
	for i := range stats {
		stats[i].desc = prometheus.NewDesc(prometheus.BuildFQName("orbitkv", "rdma", stats[i].name), stats[i].help, nil, nil)
	}
	return &rdmaCollector{eng: eng, stats: stats}
}

func (c *rdmaCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, s := range c.stats {
		ch <- s.desc
	}
}

func (c *rdmaCollector) Collect(ch chan<- prometheus.Metric) {
	e := c.eng.Load()
	if e == nil {
		return
	}
	st := e.Stats()
	for _, s := range c.stats {
		ch <- prometheus.MustNewConstMetric(s.desc, prometheus.CounterValue, float64(s.get(st)))
	}
}
