package store

import (
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the store's Prometheus series, named orbitkv_<subsystem>_<name>
// (docs/configuration.md). Gauges return to zero when the peer is idle.
type metrics struct {
	savedPages, loadedTokens    prometheus.Counter
	loadedPages, evictedPages   *prometheus.CounterVec
	demotedPages, promotedPages prometheus.Counter
	unflushedDrops              prometheus.Counter
	flusherBusy                 prometheus.Counter
	readmitted                  *prometheus.CounterVec
	askedDropped                prometheus.Counter
	corruptPages                prometheus.Counter
	ssdDropped, ssdErrors       *prometheus.CounterVec
	engineFaults                prometheus.Counter
	staged                      *prometheus.CounterVec
	unsealedPages               prometheus.Gauge
	quarantined                 prometheus.Gauge
	inflight                    prometheus.Gauge
	ssdInflight                 prometheus.GaugeFunc

	tierBytes, tierPages, tierCapacity *prometheus.GaugeVec
	catalogEntries                     prometheus.Gauge

	// Layer-wise loads: the Load call's serial phases before it answers
	// (turn, pin, plan, start; total), and enqueue to device completion.
	enqueueSec *prometheus.HistogramVec
	deviceSec  prometheus.Histogram

	fetchSeconds prometheus.Histogram // data-plane fetches (observe)
}

func newMetrics(reg *prometheus.Registry, ssdInflight func() float64) *metrics {
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
		savedPages:   counter("fabric", "saved_pages_total", "Pages newly stored by saves."),
		loadedTokens: counter("fabric", "loaded_tokens_total", "Tokens of KV restored into engines."),
		loadedPages:  prometheus.NewCounterVec(prometheus.CounterOpts(f("fabric", "loaded_pages_total", "Pages restored into engines, by source tier.")), []string{"tier"}),
		evictedPages: prometheus.NewCounterVec(prometheus.CounterOpts(f("tiers", "evicted_pages_total", "Page copies dropped from a tier.")), []string{"tier"}),
		demotedPages: counter("tiers", "demoted_pages_total", "Pages written DRAM -> SSD on eviction."),
		unflushedDrops: counter("tiers", "dram_unflushed_drops_total",
			"DRAM-only pages dropped, not demoted, to make room for a DRAM-acknowledged save: the SSD's writes fell behind the saves."),
		flusherBusy: counter("tiers", "flusher_busy_seconds_total",
			"Seconds the background flusher spent making room ahead of the saves (demotions and drops): rising at 1 a second, the disk is what holds the saves back."),
		readmitted: prometheus.NewCounterVec(prometheus.CounterOpts(f("tiers", "readmitted_pages_total",
			"Cache-fill saves of pages held only on SSD, taken back into DRAM (readmit.go), by result: attached (the same bytes: "+
				"a clean DRAM copy), replaced (other bytes: the peer's own demoted SSD copy dropped for them), kept (the SSD copy stays; ours freed), "+
				"no_room (no DRAM slot free of a write: the page stays on SSD, nothing copied), "+
				"colder (DRAM full and the page asked for no more often lately than the DRAM page it would push out: it stays on SSD, nothing copied).")), []string{"result"}),
		askedDropped: counter("tiers", "asked_dropped_total",
			"Lookups whose keys the readmission sketch did not count: its queue was full (readmit.go, RunAsks)."),
		promotedPages: counter("tiers", "promoted_pages_total", "Pages read SSD -> DRAM on a hit."),
		corruptPages:  counter("fabric", "corrupt_pages_total", "Pages that failed their checksum and were dropped."),
		ssdDropped: prometheus.NewCounterVec(prometheus.CounterOpts(f("tiers", "ssd_dropped_pages_total",
			"Pages dropped from the catalog because their SSD copy failed to read: reason io_error (an I/O error or short read) or corrupt (verification).")), []string{"reason"}),
		ssdErrors: prometheus.NewCounterVec(prometheus.CounterOpts(f("tiers", "ssd_errors_total",
			"SSD page operations that failed with an I/O error (errno, short transfer, failed sync), by op: read or write.")), []string{"op"}),
		engineFaults: counter("fabric", "engine_buffer_faults_total",
			"Engine KV buffer faults: operations refused because the buffer's file shrank under its mapping, and page copies that faulted in it."),
		staged: prometheus.NewCounterVec(prometheus.CounterOpts(f("fabric", "hbm_staged_pages_total",
			"CUDA saves' pages copied into the HBM stage of their GPU (--hbm-stage-bytes), by result: staged, skipped (no unpinned slot, or another page size than the stage's), failed (the device copy failed; the page loads from DRAM).")), []string{"result"}),
		unsealedPages:  gauge("tiers", "unsealed_pages", "DRAM pages whose checksum is still being computed."),
		quarantined:    gauge("transfer", "quarantined_bytes", "DRAM kept out of use for the process's life: a GPU copy naming it never finished."),
		inflight:       gauge("transfer", "inflight_copies", "Page copies in progress."),
		tierBytes:      prometheus.NewGaugeVec(prometheus.GaugeOpts(f("tiers", "used_bytes", "Bytes of allocated slots.")), []string{"tier"}),
		tierPages:      prometheus.NewGaugeVec(prometheus.GaugeOpts(f("tiers", "pages", "Pages held.")), []string{"tier"}),
		tierCapacity:   prometheus.NewGaugeVec(prometheus.GaugeOpts(f("tiers", "capacity_bytes", "Tier capacity.")), []string{"tier"}),
		catalogEntries: gauge("catalog", "entries", "Catalog entries."),
	}
	buckets := prometheus.ExponentialBuckets(25e-6, 2, 16) // 25 µs .. 0.8 s
	m.enqueueSec = prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: "orbitkv", Subsystem: "transfer",
		Name: "enqueue_seconds", Buckets: buckets,
		Help: "Layer-wise loads: time before the Load call answers, by phase (turn, pin, plan, start, total)."}, []string{"phase"})
	m.deviceSec = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "orbitkv", Subsystem: "transfer",
		Name: "layerwise_device_seconds", Buckets: buckets,
		Help: "Layer-wise loads: from the device batch's enqueue until the peer saw it complete."})
	m.ssdInflight = prometheus.NewGaugeFunc(prometheus.GaugeOpts(f("tiers", "ssd_inflight", "SSD operations in the kernel (queue depth).")), ssdInflight)
	reg.MustRegister(m.savedPages, m.loadedTokens, m.loadedPages, m.evictedPages, m.demotedPages, m.unflushedDrops, m.flusherBusy, m.readmitted, m.askedDropped, m.promotedPages,
		m.corruptPages, m.ssdDropped, m.ssdErrors, m.engineFaults, m.staged, m.unsealedPages, m.quarantined, m.inflight, m.ssdInflight,
		m.tierBytes, m.tierPages, m.tierCapacity, m.catalogEntries, m.enqueueSec, m.deviceSec)
	m.observe(reg)
	return m
}

// observe adds the store's data-plane fetch timing and makes every label
// value its counters and histograms can take visible at zero from the
// start, so a rate() is defined before the first event and a dashboard
// shows 0 instead of "no data".
func (m *metrics) observe(reg prometheus.Registerer) {
	m.fetchSeconds = prometheus.NewHistogram(prometheus.HistogramOpts{Namespace: "orbitkv", Subsystem: "cluster", Name: "fetch_duration_seconds",
		Help:    "Data-plane fetches of a batch of pages from one member, for loads.",
		Buckets: prometheus.ExponentialBuckets(100e-6, 2, 19)}) // 100 µs .. 26 s
	reg.MustRegister(m.fetchSeconds)
	for _, tier := range []string{"dram", "ssd", "remote", "hbm"} {
		m.loadedPages.WithLabelValues(tier)
	}
	for _, tier := range []string{"dram", "ssd"} {
		m.evictedPages.WithLabelValues(tier)
	}
	for _, r := range []string{"staged", "skipped", "failed"} {
		m.staged.WithLabelValues(r)
	}
	for _, reason := range []string{"io_error", "corrupt"} {
		m.ssdDropped.WithLabelValues(reason)
	}
	for _, op := range []string{"read", "write"} {
		m.ssdErrors.WithLabelValues(op)
	}
	for _, phase := range []string{"turn", "pin", "gates", "plan", "start", "total"} { // layerwise.go's phases
		m.enqueueSec.WithLabelValues(phase)
	}
}
