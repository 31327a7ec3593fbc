package engineapi

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the engine API's Prometheus series, named
// orbitkv_<subsystem>_<name> (docs/configuration.md). Gauges return to zero
// when the peer is idle.
type metrics struct {
	lookupHit, lookupMiss        prometheus.Counter
	lookupRecompute              prometheus.Counter
	lookupBudgetCut              prometheus.Counter
	sessions, leases, queryBytes prometheus.Gauge
	inflightOps                  prometheus.Gauge
	ops                          *opMetrics // Save and Load durations and outcomes (observe.go)
}

func newMetrics(reg *prometheus.Registry) *metrics {
	f := func(sub, name, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: "orbitkv", Subsystem: sub, Name: name, Help: help}
	}
	counter := func(sub, name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts(f(sub, name, help)))
	}
	gauge := func(sub, name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts(f(sub, name, help)))
	}
	m := &metrics{
		lookupHit:  counter("fabric", "lookup_hit_pages_total", "Pages found by lookups."),
		lookupMiss: counter("fabric", "lookup_miss_pages_total", "Pages asked for by lookups and not found."),
		lookupRecompute: counter("fabric", "lookup_recompute_pages_total",
			"Pages found only on SSD that lookups left to recompute: the SSD reads slower than the session's engine computes."),
		lookupBudgetCut: counter("fabric", "lookup_budget_cut_pages_total",
			"Pages stored in the peer that leasing lookups cut from their hit because the query budget was spent (also counted as misses)."),
		sessions:    gauge("fabric", "sessions", "Open engine sessions."),
		leases:      gauge("fabric", "leases", "Live leases."),
		queryBytes:  gauge("fabric", "query_bytes", "Bytes held by live leases (query budget in use)."),
		inflightOps: gauge("transfer", "inflight_ops", "Save and load operations in progress."),
	}
	reg.MustRegister(m.lookupHit, m.lookupMiss, m.lookupRecompute, m.lookupBudgetCut, m.sessions, m.leases,
		m.queryBytes, m.inflightOps)
	m.ops = newOpMetrics(reg)
	return m
}
