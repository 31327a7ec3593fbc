package cluster

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"

	metrics "github.com/hashicorp/go-metrics"
)

// gossipCounter sums the bytes memberlist reports sending (UDP packets,
// user messages and TCP push/pull streams) across every member of this
// process: memberlist counts them through go-metrics' global sink, which
// this installs. Catalog snapshots (gRPC) are not gossip and not counted.
type gossipCounter struct {
	bytes atomic.Uint64
}

var (
	counterOnce sync.Once
	counter     = &gossipCounter{}
)

// installGossipCounter makes counter go-metrics' global sink (once per
// process) and returns it.
func installGossipCounter() *gossipCounter {
	counterOnce.Do(func() {
		conf := metrics.DefaultConfig("orbitkv")
		conf.EnableHostname, conf.EnableRuntimeMetrics = false, false
		metrics.NewGlobal(conf, counter) //nolint:errcheck // NewGlobal fails only with a nil sink
	})
	return counter
}

func (g *gossipCounter) sent() float64 { return float64(g.bytes.Load()) }

func (g *gossipCounter) count(key []string, val float32) {
	if len(key) > 0 && key[len(key)-1] == "sent" && slices.Contains(key, "memberlist") {
		g.bytes.Add(uint64(math.Round(float64(val))))
	}
}

// go-metrics' MetricSink: only counters count.
func (g *gossipCounter) SetGauge([]string, float32)                            {}
func (g *gossipCounter) SetGaugeWithLabels([]string, float32, []metrics.Label) {}
func (g *gossipCounter) EmitKey([]string, float32)                             {}
func (g *gossipCounter) IncrCounter(key []string, val float32)                 { g.count(key, val) }
func (g *gossipCounter) IncrCounterWithLabels(key []string, val float32, _ []metrics.Label) {
	g.count(key, val)
}
func (g *gossipCounter) AddSample([]string, float32)                            {}
func (g *gossipCounter) AddSampleWithLabels([]string, float32, []metrics.Label) {}
