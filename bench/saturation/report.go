package saturation

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/orbitkv/orbitkv/bench/benchutil"
	"github.com/orbitkv/orbitkv/internal/bytesize"
)

// satResult is what one peer's run measured.
type satResult struct {
	label     string
	ssd       bool
	elapsed   time.Duration
	pageBytes uint64
	tally     satTally
	peer      satPeer // the peer's own counters over the run
}

// satFio is fio's sequential write on the run's directory, or why not.
type satFio struct {
	gbps    float64
	bytes   uint64
	skipped string
}

// satPeer is what the bench reads of the peer around a run: its metrics,
// the bytes this process had written to storage (/proc/self/io: the peer
// runs in it; the SSD tier's pages and the catalog), and the time the
// peer's CPU saves spent blocked, from Go's block profile.
type satPeer struct {
	metrics      map[string]float64
	diskWritten  uint64
	allocBlocked time.Duration // in allocating their DRAM slots
	commitBlock  time.Duration // in their catalog commits
}

// The CPU save path records no phase times (fabric/store/phases.go times
// CUDA operations only), so the bench times the saves' waits from outside,
// with Go's block profile: every goroutine blocked (a lock, a channel, a
// sleep) inside the store's allocation for a CPU save (saveChunkOf, then
// allocDRAMAs), or inside commitSaves. Time spent running or in a system
// call — the lock holder's own fsync — is not counted: what is counted is
// what the saves' page workers waited out, summed over them, like the
// H200's phase sums.
var satBlockedIn = map[string][]string{
	"alloc":  {"fabric/store.(*Store).saveChunkOf", "fabric/store.(*Store).allocDRAMAs"},
	"commit": {"fabric/store.(*Store).commitSaves"},
}

func (d *satDriver) observe(metricsAddr string) (satPeer, error) {
	m, err := benchutil.ScrapeAll(metricsAddr)
	if err != nil {
		return satPeer{}, err
	}
	written, err := selfWriteBytes()
	if err != nil {
		return satPeer{}, err
	}
	var prof bytes.Buffer
	if err := pprof.Lookup("block").WriteTo(&prof, 1); err != nil {
		return satPeer{}, fmt.Errorf("block profile: %w", err)
	}
	blocked := blockedTime(prof.String(), satBlockedIn)
	return satPeer{metrics: m, diskWritten: written, allocBlocked: blocked["alloc"], commitBlock: blocked["commit"]}, nil
}

// since is the change from before to p (counters; the block profile and
// /proc/self/io are the process's since its start).
func (p satPeer) since(before satPeer) satPeer {
	out := satPeer{metrics: map[string]float64{}, diskWritten: p.diskWritten - before.diskWritten,
		allocBlocked: p.allocBlocked - before.allocBlocked, commitBlock: p.commitBlock - before.commitBlock}
	for k, v := range p.metrics {
		out.metrics[k] = v - before.metrics[k]
	}
	return out
}

// selfWriteBytes is /proc/self/io's write_bytes: what this process caused
// to be written to storage (O_DIRECT writes included, tmpfs not).
func selfWriteBytes() (uint64, error) {
	b, err := os.ReadFile("/proc/self/io")
	if err != nil {
		return 0, fmt.Errorf("disk bytes written: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "write_bytes:"); ok {
			return strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		}
	}
	return 0, fmt.Errorf("disk bytes written: no write_bytes in /proc/self/io")
}

// blockedTime sums a block profile (runtime/pprof's debug=1 text) by
// class: a record counts for a class when its stack has every function the
// class names (as substrings of the frames' function names).
func blockedTime(prof string, classes map[string][]string) map[string]time.Duration {
	out := map[string]time.Duration{}
	perSec := 0.0
	var cycles float64
	var frames []string
	flush := func() {
		for name, want := range classes {
			if perSec > 0 && hasAll(frames, want) {
				out[name] += time.Duration(cycles / perSec * float64(time.Second))
			}
		}
		frames, cycles = nil, 0
	}
	for _, line := range strings.Split(prof, "\n") {
		switch {
		case strings.HasPrefix(line, "cycles/second="):
			perSec, _ = strconv.ParseFloat(strings.TrimPrefix(line, "cycles/second="), 64)
		case strings.HasPrefix(line, "#\t"):
			if f := strings.Split(line, "\t"); len(f) >= 3 {
				frames = append(frames, f[2])
			}
		case strings.Contains(line, " @ "):
			flush()
			cycles, _ = strconv.ParseFloat(strings.Fields(line)[0], 64)
		}
	}
	flush()
	return out
}

func hasAll(frames, want []string) bool {
	for _, w := range want {
		if !slices.ContainsFunc(frames, func(f string) bool { return strings.Contains(f, w) }) {
			return false
		}
	}
	return true
}

// fsName is the type of the file system dir is on, from /proc/mounts (the
// longest mount point that holds it); "unknown" when that cannot be read.
func fsName(dir string) string {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "unknown"
	}
	b, err := os.ReadFile("/proc/mounts")
	if err != nil {
		return "unknown"
	}
	best, kind := "", "unknown"
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 3 {
			continue
		}
		mnt := f[1]
		if (abs == mnt || strings.HasPrefix(abs, strings.TrimSuffix(mnt, "/")+"/")) && len(mnt) > len(best) {
			best, kind = mnt, f[2]+" on "+f[0]
		}
	}
	return kind
}

// percentile is the q-quantile of ds (nearest rank); 0 for none.
func percentile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(q*float64(len(s))))]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f", float64(d)/1e6) }

// latencies is "p50 / p99 / max (n)" in milliseconds.
func latencies(ds []time.Duration) string {
	if len(ds) == 0 {
		return "- (0)"
	}
	return fmt.Sprintf("%s / %s / %s (%d)", ms(percentile(ds, 0.5)), ms(percentile(ds, 0.99)), ms(slices.Max(ds)), len(ds))
}

func (r satResult) gbps(pages int) float64 {
	return float64(pages) * float64(r.pageBytes) / r.elapsed.Seconds() / 1e9
}

func (r satResult) metric(name string) string {
	return strconv.FormatFloat(r.peer.metrics[name], 'f', -1, 64)
}

// satRow is one line of the table: a name and a value per result.
type satRow struct {
	name string
	cell func(r satResult) string
}

func satRows(rs []satResult) []satRow {
	rows := []satRow{
		{"seconds driven", func(r satResult) string { return fmt.Sprintf("%.1f", r.elapsed.Seconds()) }},
		{"save GB/s accepted (new pages stored)", func(r satResult) string { return fmt.Sprintf("%.2f", r.gbps(r.tally.save.pages.ok())) }},
		{"load GB/s (pages restored, every byte checked)", func(r satResult) string { return fmt.Sprintf("%.2f", r.gbps(r.tally.checked)) }},
		{"save latency ms p50 / p99 / max (saves)", func(r satResult) string { return latencies(r.tally.save.lat) }},
		{"re-save latency ms p50 / p99 / max", func(r satResult) string { return latencies(r.tally.resave.lat) }},
		{"load latency ms p50 / p99 / max", func(r satResult) string { return latencies(r.tally.load.lat) }},
		{"new pages stored: dram / ssd", func(r satResult) string {
			return fmt.Sprintf("%d / %d", r.tally.save.pages["ok dram"], r.tally.save.pages["ok ssd"])
		}},
		{"re-saved pages acknowledged: dram / ssd", func(r satResult) string {
			return fmt.Sprintf("%d / %d", r.tally.resave.pages["ok dram"], r.tally.resave.pages["ok ssd"])
		}},
	}
	rows = append(rows, failedRows(rs)...)
	rows = append(rows,
		satRow{"lookups: pages asked / hit", func(r satResult) string { return fmt.Sprintf("%d / %d", r.tally.asked, r.tally.hit) }},
		satRow{"pages loaded: dram / ssd", func(r satResult) string {
			return fmt.Sprintf("%d / %d", r.tally.load.pages["ok dram"], r.tally.load.pages["ok ssd"])
		}},
	)
	return append(rows, peerRows()...)
}

// peerRows are the peer's own counters and the disk's, over the run.
func peerRows() []satRow {
	var rows []satRow
	for _, m := range []struct{ name, series string }{
		{"peer: saved pages", "orbitkv_fabric_saved_pages_total"},
		{"peer: demoted pages (DRAM -> SSD)", "orbitkv_tiers_demoted_pages_total"},
		{"peer: promoted pages (SSD -> DRAM)", "orbitkv_tiers_promoted_pages_total"},
		{"peer: evicted from dram", `orbitkv_tiers_evicted_pages_total{tier="dram"}`},
		{"peer: evicted from ssd", `orbitkv_tiers_evicted_pages_total{tier="ssd"}`},
		{"peer: unflushed drops (DRAM-only pages lost)", "orbitkv_tiers_dram_unflushed_drops_total"},
		{"peer: readmitted attached", `orbitkv_tiers_readmitted_pages_total{result="attached"}`},
		{"peer: readmitted kept", `orbitkv_tiers_readmitted_pages_total{result="kept"}`},
		{"peer: readmitted replaced", `orbitkv_tiers_readmitted_pages_total{result="replaced"}`},
		{"peer: readmitted no_room", `orbitkv_tiers_readmitted_pages_total{result="no_room"}`},
	} {
		rows = append(rows, satRow{m.name, func(r satResult) string { return r.metric(m.series) }})
	}
	return append(rows,
		satRow{"disk GB written (this process)", func(r satResult) string { return fmt.Sprintf("%.2f", float64(r.peer.diskWritten)/1e9) }},
		satRow{"disk write GB/s over the run", func(r satResult) string {
			return fmt.Sprintf("%.2f", float64(r.peer.diskWritten)/r.elapsed.Seconds()/1e9)
		}},
		satRow{"save alloc blocked s (block profile)", func(r satResult) string { return fmt.Sprintf("%.2f", r.peer.allocBlocked.Seconds()) }},
		satRow{"save commit blocked s (block profile)", func(r satResult) string { return fmt.Sprintf("%.2f", r.peer.commitBlock.Seconds()) }},
	)
}

// failedRows is a row per kind of failed page any result saw.
func failedRows(rs []satResult) []satRow {
	var rows []satRow
	for _, kind := range []struct {
		name string
		of   func(t *satTally) satOutcomes
	}{{"save", func(t *satTally) satOutcomes { return t.save.pages }}, {"re-save", func(t *satTally) satOutcomes { return t.resave.pages }},
		{"load", func(t *satTally) satOutcomes { return t.load.pages }}} {
		seen := map[string]bool{}
		for _, r := range rs {
			for _, k := range kind.of(&r.tally).failed() {
				if !seen[k] {
					seen[k] = true
					rows = append(rows, satRow{kind.name + " pages refused: " + k, func(r satResult) string { return strconv.Itoa(kind.of(&r.tally)[k]) }})
				}
			}
		}
		if len(seen) == 0 {
			rows = append(rows, satRow{kind.name + " pages refused", func(satResult) string { return "0" }})
		}
	}
	return rows
}

// printSaturation writes the table, the baseline (A) beside B, with B's
// save rate and latency over A's, and fio's write rate beside B's disk.
func printSaturation(w io.Writer, rs []satResult, fio satFio) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprint(tw, "\t")
	for _, r := range rs {
		fmt.Fprintf(tw, "%s\t", r.label)
	}
	fmt.Fprintln(tw)
	for _, row := range satRows(rs) {
		fmt.Fprintf(tw, "%s\t", row.name)
		for _, r := range rs {
			fmt.Fprintf(tw, "%s\t", row.cell(r))
		}
		fmt.Fprintln(tw)
	}
	tw.Flush()
	if len(rs) == 2 {
		a, b := rs[0], rs[1]
		fmt.Fprintf(w, "\nB / A: save GB/s %.2f, save latency p50 %.2f, p99 %.2f\n",
			b.gbps(b.tally.save.pages.ok())/a.gbps(a.tally.save.pages.ok()),
			ratio(percentile(b.tally.save.lat, 0.5), percentile(a.tally.save.lat, 0.5)),
			ratio(percentile(b.tally.save.lat, 0.99), percentile(a.tally.save.lat, 0.99)))
		fmt.Fprintf(w, "disk: B wrote %.2f GB/s; ", float64(b.peer.diskWritten)/b.elapsed.Seconds()/1e9)
	}
	if fio.skipped != "" {
		fmt.Fprintf(w, "fio sequential O_DIRECT write: skipped (%s)\n", fio.skipped)
		return
	}
	fmt.Fprintf(w, "fio sequential O_DIRECT write on the same directory: %.2f GB/s (%v, fresh file)\n", fio.gbps, bytesize.Size(fio.bytes))
}

func ratio(a, b time.Duration) float64 {
	if b == 0 {
		return 0
	}
	return float64(a) / float64(b)
}
