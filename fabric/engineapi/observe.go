package engineapi

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/orbitkv/orbitkv/fabric/store"
)

// opMetrics time Save and Load operations from their acceptance until every
// page is done (the RPC only accepts one, unless the engine asks to wait)
// and count their pages by outcome. Every label value is present, at zero,
// from the start.
type opMetrics struct {
	seconds *prometheus.HistogramVec // {op}
	pages   *prometheus.CounterVec   // {op, result}
}

// resultNames are op_pages_total's results, by page code.
var resultNames = map[store.Code]string{store.CodeOK: "ok", store.CodeNotFound: "not_found", store.CodeCorrupt: "corrupt",
	store.CodeNoSpace: "no_space", store.CodeDeadline: "deadline", store.CodeIOError: "io_error", store.CodeCancelled: "cancelled"}

func newOpMetrics(reg prometheus.Registerer) *opMetrics {
	m := &opMetrics{
		seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "orbitkv", Subsystem: "fabric", Name: "op_duration_seconds",
			Help:    "Save and Load operations: from acceptance until every page is done, by op.",
			Buckets: prometheus.ExponentialBuckets(100e-6, 2, 19)}, []string{"op"}), // 100 µs .. 26 s (deadlines are 30 s)
		pages: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "fabric", Name: "op_pages_total",
			Help: "Pages of Save and Load operations, by op and result (ok, not_found, corrupt, no_space, deadline, io_error, cancelled)."},
			[]string{"op", "result"}),
	}
	for _, op := range []string{"save", "load"} {
		m.seconds.WithLabelValues(op)
		for _, name := range resultNames {
			m.pages.WithLabelValues(op, name)
		}
	}
	reg.MustRegister(m.seconds, m.pages)
	return m
}

// done records a finished operation. Pages it never reached count as
// startOp reports them (the context's cause).
func (m *opMetrics) done(ctx context.Context, load bool, start time.Time, res []store.Result) {
	op := "save"
	if load {
		op = "load"
	}
	m.seconds.WithLabelValues(op).Observe(time.Since(start).Seconds())
	for _, r := range res {
		code := r.Code
		if code == store.CodePending {
			code = store.FailResult(context.Cause(ctx)).Code
		}
		if name, ok := resultNames[code]; ok {
			m.pages.WithLabelValues(op, name).Inc()
		}
	}
}
