package report

import (
	"fmt"
	"image"
	"image/color"
	"image/draw"
	"image/png"
	"math"
	"os"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// Plot geometry and palette: small PNGs that read well at 100%.
const (
	plotW, plotH = 720, 420
	marginL      = 78
	marginR      = 24
	marginT      = 56
	marginB      = 62
)

var (
	white   = color.RGBA{255, 255, 255, 255}
	black   = color.RGBA{20, 20, 20, 255}
	grid    = color.RGBA{225, 225, 225, 255}
	palette = []color.RGBA{
		{31, 119, 180, 255}, {214, 39, 40, 255}, {44, 160, 44, 255},
		{255, 127, 14, 255}, {148, 103, 189, 255}, {140, 86, 75, 255},
	}
	face = basicfont.Face7x13
)

// canvas is an image with a plotting area and text helpers.
type canvas struct {
	img    *image.RGBA
	x0, y0 int // plot area top-left
	x1, y1 int // plot area bottom-right
}

func newCanvas(title string) *canvas {
	c := &canvas{img: image.NewRGBA(image.Rect(0, 0, plotW, plotH)),
		x0: marginL, y0: marginT, x1: plotW - marginR, y1: plotH - marginB}
	draw.Draw(c.img, c.img.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)
	c.text(plotW/2, 22, title, black, alignCenter)
	return c
}

type align int

const (
	alignLeft align = iota
	alignCenter
	alignRight
)

// text draws s with its baseline at y.
func (c *canvas) text(x, y int, s string, col color.Color, a align) {
	d := &font.Drawer{Dst: c.img, Src: image.NewUniform(col), Face: face}
	w := d.MeasureString(s).Ceil()
	switch a {
	case alignCenter:
		x -= w / 2
	case alignRight:
		x -= w
	}
	d.Dot = fixed.P(x, y)
	d.DrawString(s)
}

// vtext draws s rotated 90° counter-clockwise, centred on (x, y).
func (c *canvas) vtext(x, y int, s string, col color.Color) {
	d := &font.Drawer{Face: face}
	w, h := d.MeasureString(s).Ceil(), 13
	tmp := image.NewRGBA(image.Rect(0, 0, w, h))
	draw.Draw(tmp, tmp.Bounds(), image.NewUniform(white), image.Point{}, draw.Src)
	d.Dst, d.Src, d.Dot = tmp, image.NewUniform(col), fixed.P(0, 10)
	d.DrawString(s)
	for ty := 0; ty < h; ty++ {
		for tx := 0; tx < w; tx++ {
			if p := tmp.RGBAAt(tx, ty); p != white {
				c.img.SetRGBA(x-h/2+ty, y+w/2-tx, p)
			}
		}
	}
}

func (c *canvas) hline(x0, x1, y int, col color.RGBA) {
	for x := min(x0, x1); x <= max(x0, x1); x++ {
		c.img.SetRGBA(x, y, col)
	}
}

func (c *canvas) vline(x, y0, y1 int, col color.RGBA) {
	for y := min(y0, y1); y <= max(y0, y1); y++ {
		c.img.SetRGBA(x, y, col)
	}
}

func (c *canvas) fill(x0, y0, x1, y1 int, col color.RGBA) {
	draw.Draw(c.img, image.Rect(min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)), image.NewUniform(col), image.Point{}, draw.Src)
}

// segment draws a 2-pixel line (Bresenham, doubled vertically).
func (c *canvas) segment(x0, y0, x1, y1 int, col color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := sign(x1-x0), sign(y1-y0)
	e := dx + dy
	for {
		c.img.SetRGBA(x0, y0, col)
		c.img.SetRGBA(x0, y0+1, col)
		if x0 == x1 && y0 == y1 {
			return
		}
		if e2 := 2 * e; e2 >= dy {
			e += dy
			x0 += sx
		} else {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

func sign(v int) int {
	switch {
	case v < 0:
		return -1
	case v > 0:
		return 1
	}
	return 0
}

// scale maps data values to pixels along one axis.
type scale struct {
	lo, hi float64
	log    bool
	p0, p1 int // pixels of lo and hi
}

func (s scale) px(v float64) int {
	lo, hi := s.lo, s.hi
	if s.log {
		v, lo, hi = math.Log10(max(v, 1e-12)), math.Log10(lo), math.Log10(hi)
	}
	f := 0.0
	if hi > lo {
		f = (v - lo) / (hi - lo)
	}
	return s.p0 + int(math.Round(f*float64(s.p1-s.p0)))
}

// niceTicks returns round tick values covering [lo, hi], about n of them.
func niceTicks(lo, hi float64, n int) []float64 {
	if hi <= lo {
		hi = lo + 1
	}
	raw := (hi - lo) / float64(n)
	mag := math.Pow(10, math.Floor(math.Log10(raw)))
	step := mag
	for _, m := range []float64{1, 2, 2.5, 5, 10} {
		if m*mag >= raw {
			step = m * mag
			break
		}
	}
	var out []float64
	first, last := math.Floor(lo/step+1e-9), math.Ceil(hi/step-1e-9)
	for k := first; k <= last; k++ {
		out = append(out, k*step)
	}
	return out
}

// logTicks returns 1-2-5 ticks per decade within [lo, hi].
func logTicks(lo, hi float64) []float64 {
	var out []float64
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			if v := m * math.Pow(10, e); v >= lo*0.999 && v <= hi*1.001 {
				out = append(out, v)
			}
		}
	}
	return out
}

func tickLabel(v float64) string {
	switch a := math.Abs(v); {
	case a == 0:
		return "0"
	case a >= 10000:
		return fmt.Sprintf("%.0fk", v/1000)
	case a >= 10:
		return fmt.Sprintf("%.0f", v)
	case a >= 1:
		return fmt.Sprintf("%.4g", v)
	}
	return fmt.Sprintf("%.3g", v)
}

// axes draws grid, ticks and labels for an x and a y scale.
func (c *canvas) axes(x, y scale, xticks, yticks []float64, xlabel, ylabel string) {
	for _, t := range yticks {
		py := y.px(t)
		c.hline(c.x0, c.x1, py, grid)
		c.hline(c.x0-5, c.x0, py, black)
		c.text(c.x0-8, py+4, tickLabel(t), black, alignRight)
	}
	for _, t := range xticks {
		px := x.px(t)
		c.vline(px, c.y0, c.y1, grid)
		c.vline(px, c.y1, c.y1+5, black)
		c.text(px, c.y1+19, tickLabel(t), black, alignCenter)
	}
	c.hline(c.x0, c.x1, c.y1, black)
	c.vline(c.x0, c.y0, c.y1, black)
	c.text((c.x0+c.x1)/2, plotH-14, xlabel, black, alignCenter)
	c.vtext(16, (c.y0+c.y1)/2, ylabel, black)
}

// legend draws a row of coloured swatches with names between the title and
// the plot area, centred.
func (c *canvas) legend(names []string) {
	const swatch, gap = 22, 18
	d := &font.Drawer{Face: face}
	total := 0
	for _, n := range names {
		total += swatch + d.MeasureString(n).Ceil() + gap
	}
	x, y := (plotW-total+gap)/2, 42
	for i, n := range names {
		c.fill(x, y-9, x+16, y+1, palette[i%len(palette)])
		c.text(x+swatch, y, n, black, alignLeft)
		x += swatch + d.MeasureString(n).Ceil() + gap
	}
}

func (c *canvas) save(path string) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("write plot: %w", err)
	}
	if err := png.Encode(f, c.img); err != nil {
		f.Close()
		return fmt.Errorf("encode %s: %w", path, err)
	}
	return f.Close()
}
