package soak

import (
	"bytes"
	"encoding/csv"
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// resource is one sampled series and its growth bound: the median of the
// last third of the samples after warm-up may be at most ratio times the
// first third's median plus slack. The gauges go up and down with the
// load, so their bounds are loose; what leaks shows in the last third.
type resource struct {
	name   string
	metric string // the peer's series ("" for mapped regions: /proc/PID/maps)
	ratio  float64
	slack  float64
}

var resources = []resource{
	{"rss_bytes", "process_resident_memory_bytes", 1.25, 32 << 20},
	{"goroutines", "go_goroutines", 1.25, 50},
	{"open_fds", "process_open_fds", 1.25, 32},
	{"maps", "", 1.25, 64},
	{"query_bytes", "orbitkv_fabric_query_bytes", 2, 1 << 20},
	{"gpu_inflight_ops", "orbitkv_transfer_inflight_ops", 2, 32},
	{"gpu_inflight_copies", "orbitkv_transfer_inflight_copies", 2, 32},
	{"ssd_inflight", "orbitkv_tiers_ssd_inflight", 2, 64},
	{"leases", "orbitkv_fabric_leases", 2, 256},
	{"sessions", "orbitkv_fabric_sessions", 2, 16},
}

// warmup is the share of the run whose samples the growth check skips.
const warmup = 1.0 / 6

type sample struct {
	at   time.Duration // since the start
	peer string
	gen  int64
	pid  int
	v    []float64
}

// sampleAll samples every peer that is up and answers its metrics.
func (s *soak) sampleAll() {
	for _, pr := range s.peers {
		if pr.down.Load() {
			continue
		}
		p := pr.p.Load()
		m, err := scrape(p.metrics)
		if err != nil {
			continue
		}
		maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", p.pid()))
		if err != nil {
			continue
		}
		sm := sample{at: time.Since(s.start), peer: pr.name, gen: pr.gen.Load(), pid: p.pid()}
		for _, r := range resources {
			if r.metric == "" {
				sm.v = append(sm.v, float64(bytes.Count(maps, []byte("\n"))))
			} else {
				sm.v = append(sm.v, m[r.metric])
			}
		}
		s.samp = append(s.samp, sm)
	}
}

type growthRow struct {
	peer, res          string
	first, last, bound float64
	nFirst, nLast      int
	over               bool
}

func (g growthRow) String() string {
	return fmt.Sprintf("%s %s: first third median %g (%d samples), last third %g (%d), bound %g",
		g.peer, g.res, g.first, g.nFirst, g.last, g.nLast, g.bound)
}

func median(xs []float64) float64 {
	if len(xs) == 0 {
		return math.NaN()
	}
	xs = slices.Clone(xs)
	slices.Sort(xs)
	if len(xs)%2 == 1 {
		return xs[len(xs)/2]
	}
	return (xs[len(xs)/2-1] + xs[len(xs)/2]) / 2
}

// growth compares each peer's and resource's thirds after warm-up.
func (s *soak) growth() []growthRow {
	w := time.Duration(float64(s.dur) * warmup)
	third := (s.dur - w) / 3
	var rows []growthRow
	for _, pr := range s.peers {
		for i, r := range resources {
			var first, last []float64
			for _, sm := range s.samp {
				switch {
				case sm.peer != pr.name:
				case sm.at >= w && sm.at < w+third:
					first = append(first, sm.v[i])
				case sm.at >= s.dur-third:
					last = append(last, sm.v[i])
				}
			}
			g := growthRow{peer: pr.name, res: r.name, first: median(first), last: median(last), nFirst: len(first), nLast: len(last)}
			g.bound = g.first*r.ratio + r.slack
			g.over = len(first) == 0 || len(last) == 0 || g.last > g.bound
			rows = append(rows, g)
		}
	}
	return rows
}

// writeOutputs writes samples.csv, samples.png and summary.txt.
func (s *soak) writeOutputs(growth []growthRow) error {
	var b bytes.Buffer
	cw := csv.NewWriter(&b)
	head := []string{"seconds", "peer", "generation", "pid"}
	for _, r := range resources {
		head = append(head, r.name)
	}
	cw.Write(head)
	for _, sm := range s.samp {
		row := []string{strconv.FormatFloat(sm.at.Seconds(), 'f', 1, 64), sm.peer, strconv.FormatInt(sm.gen, 10), strconv.Itoa(sm.pid)}
		for _, v := range sm.v {
			row = append(row, strconv.FormatFloat(v, 'f', -1, 64))
		}
		cw.Write(row)
	}
	cw.Flush()
	if err := os.WriteFile(filepath.Join(s.out, "samples.csv"), b.Bytes(), 0o644); err != nil {
		return err
	}
	b.Reset()
	c := &s.c
	fmt.Fprintf(&b, "soak of %v, samples every %v; peers: %d (solo%s)\n", s.dur, s.every, len(s.peers),
		map[bool]string{true: " and a 3-peer cluster in network namespaces", false: " only"}[s.lan != nil])
	fmt.Fprintf(&b, "operations: %d SSD saves and %d DRAM saves acknowledged, %d refused (no space); %d local loads (%d not found, %d refused for room or time), %d remote loads (%d not served); %d local loads fetched from a member that failed; %d leasing lookups (%d leases); %d evictions; %d engine-process operations; %d operations cut by a peer kill\n",
		c.savesSSD.Load(), c.savesDRAM.Load(), c.refused.Load(), c.loads.Load(), c.notFound.Load(), c.refusedLoads.Load(), c.loadsRemote.Load(), c.remoteMisses.Load(), c.fetchFailures.Load(),
		c.lookups.Load(), c.leases.Load(), c.evictions.Load(), c.childOps.Load(), c.interrupted.Load())
	fmt.Fprintf(&b, "faults: %d peer SIGKILLs (restarted on their data directories), %d engine processes SIGKILLed, %d partitions (%s)\n",
		c.peerKills.Load(), c.engineKills.Load(), c.partitions.Load(), s.how)
	fmt.Fprintf(&b, "acknowledged SSD pages checked after restarts and at the end: %d (%d rounds asked again for pages refused for room); lost %d, wrong %d, hangs %d, other failures %d\n",
		c.checked.Load(), c.checkRetries.Load(), c.lost.Load(), c.wrong.Load(), c.hangs.Load(), c.bad.Load())
	fmt.Fprintf(&b, "growth (medians after the first %.0f%% of the run: first third -> last third, bound):\n", warmup*100)
	for _, g := range growth {
		verdict := "ok"
		if g.over {
			verdict = "OVER"
		}
		fmt.Fprintf(&b, "  %-7s %-20s %14.6g -> %-14.6g bound %-14.6g n=%d/%d %s\n", g.peer, g.res, g.first, g.last, g.bound, g.nFirst, g.nLast, verdict)
	}
	if err := os.WriteFile(filepath.Join(s.out, "summary.txt"), b.Bytes(), 0o644); err != nil {
		return err
	}
	return s.plot(filepath.Join(s.out, "samples.png"))
}

// plot draws the first four resources (RSS, goroutines, fds, maps), one
// panel each, one line per peer.
func (s *soak) plot(path string) error {
	const pw, ph, cols = 560, 300, 2
	img := image.NewRGBA(image.Rect(0, 0, pw*cols, ph*2))
	draw.Draw(img, img.Bounds(), image.White, image.Point{}, draw.Src)
	palette := []color.RGBA{{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255}, {148, 103, 189, 255}}
	text := func(x, y int, str string, col color.Color) {
		d := font.Drawer{Dst: img, Src: image.NewUniform(col), Face: basicfont.Face7x13, Dot: fixed.P(x, y)}
		d.DrawString(str)
	}
	span := s.dur.Seconds() // a run goes on past its duration until its last fault
	for _, sm := range s.samp {
		span = max(span, sm.at.Seconds())
	}
	for i, r := range resources[:4] {
		x0, y0 := (i%cols)*pw+60, (i/cols)*ph+30
		w, h := pw-80, ph-70
		lo, hi := math.Inf(1), math.Inf(-1)
		for _, sm := range s.samp {
			lo, hi = min(lo, sm.v[i]), max(hi, sm.v[i])
		}
		if hi <= lo {
			hi, lo = lo+1, lo-1
		}
		lo = 0
		scale := 1.0
		unit := ""
		if r.name == "rss_bytes" {
			scale, unit = 1<<20, " (MiB)"
		}
		text(x0, y0-10, r.name+unit, color.Black)
		for y := y0; y <= y0+h; y++ {
			img.Set(x0, y, color.Gray{120})
		}
		for x := x0; x <= x0+w; x++ {
			img.Set(x, y0+h, color.Gray{120})
		}
		text(x0-55, y0+8, fmt.Sprintf("%.4g", hi/scale), color.Black)
		text(x0-55, y0+h, "0", color.Black)
		text(x0, y0+h+15, "0", color.Black)
		text(x0+w-60, y0+h+15, fmt.Sprintf("%.0f s", span), color.Black)
		px := func(sm sample) (int, int) {
			return x0 + int(float64(w)*sm.at.Seconds()/span), y0 + h - int(float64(h)*(sm.v[i]-lo)/(hi-lo))
		}
		for pi, pr := range s.peers {
			col := palette[pi%len(palette)]
			if i == 0 {
				text(x0+w-150, y0+15+13*pi, pr.name, col)
			}
			var prev *sample
			for k := range s.samp {
				sm := &s.samp[k]
				if sm.peer != pr.name {
					continue
				}
				if prev != nil && prev.gen == sm.gen {
					line(img, px2(px, *prev), px2(px, *sm), col)
				}
				x, y := px(*sm)
				img.Set(x, y, col)
				prev = sm
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

func px2(px func(sample) (int, int), sm sample) image.Point {
	x, y := px(sm)
	return image.Pt(x, y)
}

// line draws a segment (Bresenham).
func line(img *image.RGBA, a, b image.Point, col color.RGBA) {
	dx, dy := abs(b.X-a.X), -abs(b.Y-a.Y)
	sx, sy := sign(b.X-a.X), sign(b.Y-a.Y)
	e := dx + dy
	for {
		img.Set(a.X, a.Y, col)
		if a == b {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			a.X += sx
		}
		if e2 <= dx {
			e += dx
			a.Y += sy
		}
	}
}

func abs(v int) int { return max(v, -v) }

func sign(v int) int {
	switch {
	case v > 0:
		return 1
	case v < 0:
		return -1
	}
	return 0
}
