package store

import (
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Where a CUDA session's whole-request loads and saves spend their time,
// phase by phase, so that the gap between an operation and its device copy
// is measured where it occurs (bench gpu prints it beside the copy rates).

// gpuOp is a kind of CUDA operation.
type gpuOp int

const (
	gpuLoad gpuOp = iota
	gpuSave
	nGPUOps
)

// Phases, in the order an operation passes them. A load: pin (catalog
// look-ups and pins, SSD reads), plan (descriptors), copy (the device
// transport: a copier in hand, lowering, the copy, its completion), finish
// (unpins, results). A save: alloc (DRAM slots), plan, copy, finish
// (SSD write-through if asked, catalog commit).
const (
	phasePin = iota
	phasePlan
	phaseCopy
	phaseFinish
	nPhases
)

var (
	gpuOpNames    = [nGPUOps]string{"load", "save"}
	gpuPhaseNames = [nGPUOps][nPhases]string{{"pin", "plan", "copy", "finish"}, {"alloc", "plan", "copy", "finish"}}
)

// phaseTable accumulates phase times per operation kind.
type phaseTable struct {
	ops   [nGPUOps]atomic.Int64
	nanos [nGPUOps][nPhases]atomic.Int64
}

// clock is the store's one phase timer: it times an operation's phases,
// lap(p) charging the time since the previous lap to phase p through
// record. Whole-request CUDA loads and saves record into the phase table;
// layer-wise loads into the enqueue histogram (layerwise.go).
type clock struct {
	start, last time.Time
	record      func(phase int, d time.Duration)
}

func newClock(record func(phase int, d time.Duration)) *clock {
	now := time.Now()
	return &clock{start: now, last: now, record: record}
}

func (t *phaseTable) start(op gpuOp) *clock {
	t.ops[op].Add(1)
	return newClock(func(phase int, d time.Duration) { t.nanos[op][phase].Add(int64(d)) })
}

func (c *clock) lap(phase int) {
	now := time.Now()
	c.record(phase, now.Sub(c.last))
	c.last = now
}

// total is the time from the clock's start to its last lap.
func (c *clock) total() time.Duration { return c.last.Sub(c.start) }

// GPUPhases is a snapshot of the phase table: operations counted and total
// time per phase, by operation ("load", "save") and phase name.
type GPUPhases struct {
	Ops   map[string]int64
	Phase map[string]map[string]time.Duration
	Order map[string][]string // each operation's phase names, in the order it passes them
}

// GPUPhases returns the phase table since the store was made.
func (s *Store) GPUPhases() GPUPhases {
	t := &s.phases
	out := GPUPhases{Ops: map[string]int64{}, Phase: map[string]map[string]time.Duration{}, Order: map[string][]string{}}
	for op := range nGPUOps {
		out.Ops[gpuOpNames[op]] = t.ops[op].Load()
		out.Order[gpuOpNames[op]] = gpuPhaseNames[op][:]
		m := map[string]time.Duration{}
		for ph := range nPhases {
			m[gpuPhaseNames[op][ph]] = time.Duration(t.nanos[op][ph].Load())
		}
		out.Phase[gpuOpNames[op]] = m
	}
	return out
}

// collectors exports the table as orbitkv_transfer_gpu_phase_seconds_total
// and orbitkv_transfer_gpu_ops_total.
func (t *phaseTable) collectors() []prometheus.Collector {
	var cs []prometheus.Collector
	for op := range nGPUOps {
		cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "transfer",
			Name: "gpu_ops_total", Help: "Whole-request CUDA loads and saves (device batches: an operation larger than a quarter of the DRAM pool counts once per batch).", ConstLabels: prometheus.Labels{"op": gpuOpNames[op]}},
			func() float64 { return float64(t.ops[op].Load()) }))
		for ph := range nPhases {
			cs = append(cs, prometheus.NewCounterFunc(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "transfer",
				Name: "gpu_phase_seconds_total", Help: "Whole-request CUDA loads and saves: time by phase.",
				ConstLabels: prometheus.Labels{"op": gpuOpNames[op], "phase": gpuPhaseNames[op][ph]}},
				func() float64 { return time.Duration(t.nanos[op][ph].Load()).Seconds() }))
		}
	}
	return cs
}
