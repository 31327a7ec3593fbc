package report

import (
	"fmt"
	"math"
	"slices"
)

// series is one line of a line chart.
type series struct {
	name   string
	xs, ys []float64
}

// cdfChart plots the empirical CDF of each sample; the x axis is logarithmic
// when the values span more than a decade.
func cdfChart(path, title, xlabel string, names []string, samples [][]float64) error {
	c := newCanvas(title)
	lo, hi := math.Inf(1), math.Inf(-1)
	for _, s := range samples {
		for _, v := range s {
			if v > 0 {
				lo, hi = min(lo, v), max(hi, v)
			}
		}
	}
	if math.IsInf(lo, 1) {
		lo, hi = 1, 10
	}
	x := scale{lo: lo, hi: hi, p0: c.x0, p1: c.x1}
	var xt []float64
	if hi/lo > 10 {
		x.log = true
		x.lo, x.hi = lo/1.1, hi*1.1
		xt = logTicks(x.lo, x.hi)
	} else {
		xt = niceTicks(0, hi*1.05, 8)
		x.lo, x.hi = 0, xt[len(xt)-1]
	}
	y := scale{lo: 0, hi: 1, p0: c.y1, p1: c.y0}
	c.axes(x, y, xt, niceTicks(0, 1, 5), xlabel, "fraction of requests <= x")
	for i, s := range samples {
		col := palette[i%len(palette)]
		v := slices.Clone(s)
		slices.Sort(v)
		px, py := x.px(max(v[0], x.lo)), y.px(0)
		for j, val := range v {
			nx, ny := x.px(max(val, x.lo)), y.px(float64(j+1)/float64(len(v)))
			c.segment(px, py, nx, py, col) // step: across, then up
			c.segment(nx, py, nx, ny, col)
			px, py = nx, ny
		}
	}
	c.legend(names)
	return c.save(path)
}

// bar is one bar of a grouped bar chart.
type bar struct {
	value float64    // NaN: not measured, drawn as "n/a"
	label string     // under the bar ("" for none)
	err   [2]float64 // optional interval drawn as a whisker (both 0: none)
}

// barChart draws groups of bars; colour i is series i within a group.
// fixedTop > 0 fixes the top of the y axis (1 for fractions).
func barChart(path, title, ylabel string, fixedTop float64, groups []string, bars [][]bar, seriesNames []string) error {
	c := newCanvas(title)
	top := fixedTop
	for _, g := range bars {
		for _, b := range g {
			if !math.IsNaN(b.value) {
				top = max(top, b.value, b.err[1])
			}
		}
	}
	if top == 0 {
		top = 1
	}
	if fixedTop == 0 {
		top *= 1.1
	}
	yt := niceTicks(0, top, 6)
	y := scale{lo: 0, hi: yt[len(yt)-1], p0: c.y1, p1: c.y0}
	c.axes(scale{lo: 0, hi: 1, p0: c.x0, p1: c.x1}, y, nil, yt, "", ylabel)
	gw := float64(c.x1-c.x0) / float64(len(groups))
	for gi, g := range bars {
		gx := c.x0 + int(float64(gi)*gw)
		bw := int(gw*0.8) / max(1, len(g))
		for bi, b := range g {
			bx := gx + int(gw*0.1) + bi*bw
			col := palette[bi%len(palette)]
			if len(seriesNames) == 0 {
				col = palette[gi%len(palette)]
			}
			if math.IsNaN(b.value) { // nothing measured: say so instead of drawing 0
				c.text(bx+bw/2, c.y1-4, "n/a", black, alignCenter)
				continue
			}
			c.fill(bx+2, y.px(b.value), bx+bw-2, c.y1, col)
			c.text(bx+bw/2, y.px(b.value)-4, tickLabel3(b.value), black, alignCenter)
			if b.err != [2]float64{} {
				mx := bx + bw/2
				c.vline(mx, y.px(b.err[0]), y.px(b.err[1]), black)
				c.hline(mx-5, mx+5, y.px(b.err[0]), black)
				c.hline(mx-5, mx+5, y.px(b.err[1]), black)
			}
			if b.label != "" {
				c.text(bx+bw/2, c.y1+16, b.label, black, alignCenter)
			}
		}
		c.text(gx+int(gw/2), c.y1+34, groups[gi], black, alignCenter)
	}
	if len(seriesNames) > 0 {
		c.legend(seriesNames)
	}
	return c.save(path)
}

// tickLabel3 labels a bar with three significant digits.
func tickLabel3(v float64) string {
	if v == 0 || math.Abs(v) >= 1000 {
		return fmt.Sprintf("%.0f", v)
	}
	return fmt.Sprintf("%.3g", v)
}
