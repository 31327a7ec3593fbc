package fabric

import (
	"github.com/orbitkv/orbitkv/fabric/store"
	"strings"

	"github.com/prometheus/client_golang/prometheus"

	"context"
	"fmt"
	"github.com/orbitkv/orbitkv/catalog"
	"time"
)

// problem says why the peer is unhealthy at now, "" when it is healthy:
// what Status reports. Every source of ill health joins here.
func (p *Peer) problem(now time.Time) string {
	var out []string
	for _, s := range []string{p.pages.Problem(now), p.catalogProblem()} {
		if s != "" {
			out = append(out, s)
		}
	}
	return strings.Join(out, "; ")
}

// catalogProblem says why the catalog makes the peer unhealthy, "" when
// it does not: a catalog that cannot persist fails every save to SSD.
func (p *Peer) catalogProblem() string {
	if err := p.cat.Health(); err != nil {
		return "catalog: " + err.Error() + " (saves to SSD fail; DRAM serves)"
	}
	return ""
}

// Catalog watch: a healthy catalog is checked every catalogCheck (Repair
// then only looks for a failure Pebble reported on its own goroutines); an
// unhealthy one is retried after catalogRetryMin, doubling to
// catalogRetryMax. A fault logs once when it starts, at most once per
// catalogLogEvery while it lasts, and once when it ends.
const (
	catalogCheck    = time.Second
	catalogRetryMin = 250 * time.Millisecond
	catalogRetryMax = 10 * time.Second
	catalogLogEvery = time.Minute
)

// watchCatalog repairs the catalog while it is unhealthy (a full or
// failing filesystem, corruption Pebble reported), with backoff, until ctx
// ends. The peer's Run owns it. The peer serves meanwhile: DRAM saves and
// loads, and loads from SSD.
func (p *Peer) watchCatalog(ctx context.Context) {
	wait := catalogRetryMin
	var bad error
	var logged time.Time
	for {
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		err := p.cat.Repair()
		switch {
		case err == nil && bad != nil:
			p.log.Info().Str("was", bad.Error()).Msg("catalog healthy again: saves to SSD resume")
			bad, wait = nil, catalogCheck
		case err == nil:
			wait = catalogCheck
		case bad == nil || time.Since(logged) >= catalogLogEvery:
			p.log.Error().Err(err).Dur("retry_in", wait).Msg("catalog cannot persist: saves to SSD fail, DRAM serves; retrying")
			bad, logged = err, time.Now()
			fallthrough
		default:
			wait = min(2*wait, catalogRetryMax)
		}
	}
}

// logRecovery logs what the start recovered, rebuilt and dropped, and
// counts it.
func (p *Peer) logRecovery(rep store.RecoverReport, why string) {
	m := newRecoveryMetrics(p.m.reg, p.cat)
	m.rebuilt.Add(float64(rep.Rebuilt))
	m.dropped.Add(float64(rep.Dropped))
	m.contradicting.Add(float64(len(rep.Contradicting)))
	p.logContradicting(rep.Contradicting)
	st := p.cat.Stats()
	ev := p.log.Info()
	if st.Damage.Reason != "" || rep.Rebuilt > 0 || rep.Dropped > 0 || len(rep.Contradicting) > 0 {
		ev = p.log.Warn()
	}
	if st.Damage.Reason != "" {
		ev = ev.Str("catalog_damage", st.Damage.Reason).Str("damaged_catalog_moved_to", st.Damage.MovedAside)
	}
	ev = ev.Str("scan", rep.Mode.String()).Str("scan_reason", why)
	if rep.Scanned {
		ev = ev.Uint64("scanned_bytes", rep.Scan.BytesRead).Uint64("generation_limit", rep.GenLimit).Int("torn_slots", rep.Scan.Torn+rep.Unverifiable).Int("verified_pages", rep.Verified)
	}
	ev.Int("pages", rep.Kept+rep.Rebuilt).Int("rebuilt", rep.Rebuilt).Int("dropped", rep.Dropped).
		Int("contradicting_slots", len(rep.Contradicting)).Int("corrupt_records", st.CorruptRecords).Msg("recovered ssd pages")
	p.startRepair = startRepairText(st.Damage.Reason, rep.Rebuilt, rep.Dropped)
	if err := p.cat.Health(); err != nil {
		p.log.Error().Err(err).Msg("catalog cannot persist at start: saves to SSD fail, DRAM serves; retrying")
	}
}

// contradictingLogged is how many contradicting slots a start logs one by
// one; the "recovered ssd pages" line counts them all.
const contradictingLogged = 10

// logContradicting logs the slots the start dropped because they
// contradict the catalog entry naming them (store.ContradictingSlot).
func (p *Peer) logContradicting(bad []store.ContradictingSlot) {
	for _, c := range bad[:min(len(bad), contradictingLogged)] {
		e, h, l := c.Entry, c.Found.Header, c.Found.Loc
		ev := p.log.Error().Uint32("file", l.File).Uint64("offset", l.Offset).
			Str("slot_key", h.Key.String()).Uint64("slot_generation", h.Generation).Uint32("slot_checksum", h.Checksum)
		if e.OnSSD {
			ev = ev.Str("key", e.Key.String()).Uint64("generation", e.Generation).Uint32("checksum", e.Checksum)
		}
		if c.AboveLimit {
			ev.Msg("ssd slot's generation is above any this peer handed out: slot dropped, not adopted")
			continue
		}
		ev.Msg("ssd slot contradicts the catalog entry naming it: page dropped, not adopted")
	}
	if len(bad) > contradictingLogged {
		p.log.Error().Int("not_logged", len(bad)-contradictingLogged).Msg("more ssd slots contradict the catalog: pages dropped")
	}
}

// startRepairText is what Status says the start repaired ("" for nothing):
// the catalog is then healthy again, but an operator should know it was not.
func startRepairText(damage string, rebuilt, dropped int) string {
	if damage == "" && rebuilt == 0 && dropped == 0 {
		return ""
	}
	out := fmt.Sprintf("catalog repaired at start from the SSD page headers: %d pages rebuilt, %d dropped", rebuilt, dropped)
	if damage != "" {
		out += " (damage: " + damage + ")"
	}
	return out
}

// recoveryMetrics count what recoveries rebuilt and dropped.
type recoveryMetrics struct {
	rebuilt, dropped, contradicting prometheus.Counter
}

func newRecoveryMetrics(reg *prometheus.Registry, cat *catalog.Catalog) *recoveryMetrics {
	m := &recoveryMetrics{
		rebuilt: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "catalog", Name: "rebuilt_pages_total",
			Help: "SSD pages the catalog did not name (damaged, missing or truncated catalog) rebuilt from the page files' slot headers at start."}),
		dropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "catalog", Name: "dropped_pages_total",
			Help: "Catalog entries dropped at start because the page files do not hold their page whole."}),
		contradicting: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "orbitkv", Subsystem: "catalog", Name: "contradicting_slots_total",
			Help: "SSD slots found whole at start whose header contradicts the catalog entry naming the slot (another key, layout, length or checksum at no newer generation), " +
				"or carries a generation above any the peer handed out (its generation limit): dropped, never adopted."}),
	}
	healthy := prometheus.NewGaugeFunc(prometheus.GaugeOpts{Namespace: "orbitkv", Subsystem: "catalog", Name: "healthy",
		Help: "1 when the catalog persists commits; 0 while its filesystem is full or its store failed (saves to SSD fail)."},
		func() float64 {
			if cat.Health() != nil {
				return 0
			}
			return 1
		})
	reg.MustRegister(m.rebuilt, m.dropped, m.contradicting, healthy)
	return m
}
