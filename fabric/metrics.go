package fabric

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// metrics is the peer's Prometheus registry: the wings register their
// series in it (orbitkv_<subsystem>_<name>, docs/configuration.md), the
// root the Go runtime's and the process's.
type metrics struct {
	reg *prometheus.Registry
	rpc *rpcMetrics // every RPC's rate, errors and duration (observe.go)
}

func newMetrics() *metrics {
	m := &metrics{reg: prometheus.NewRegistry()}
	m.reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.rpc = newRPCMetrics(m.reg)
	registerBuildInfo(m.reg)
	return m
}
