package cluster

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orbitkv/orbitkv/transfer/tcp"
)

// servedStats exports what this peer's data plane served to members (the
// other side of orbitkv_cluster_fetched_*): read from the tcp.Server's own
// counters when metrics are scraped. The server exists only once the
// cluster has started; until then (and standalone) every series reads 0.
type servedStats struct {
	srv atomic.Pointer[tcp.Server]
}

func (s *servedStats) stats() tcp.ServerStats {
	if srv := s.srv.Load(); srv != nil {
		return srv.Stats()
	}
	return tcp.ServerStats{}
}

func (s *servedStats) register(reg *prometheus.Registry) {
	counter := func(name, help string, v func(tcp.ServerStats) uint64) prometheus.Collector {
		return prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "cluster", Name: name, Help: help},
			func() float64 { return float64(v(s.stats())) })
	}
	reg.MustRegister(
		counter("served_requests_total", "Data plane fetch requests members sent this peer.",
			func(st tcp.ServerStats) uint64 { return st.Requests }),
		counter("served_pages_total", "Pages this peer sent members over the data plane.",
			func(st tcp.ServerStats) uint64 { return st.Pages }),
		counter("served_bytes_total", "Page bytes this peer sent members over the data plane.",
			func(st tcp.ServerStats) uint64 { return st.Bytes }),
		counter("served_missing_pages_total", "Pages members asked this peer for that it did not hold.",
			func(st tcp.ServerStats) uint64 { return st.Missing }),
	)
}
