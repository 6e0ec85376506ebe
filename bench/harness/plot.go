package harness

import (
	"fmt"
	"image/color"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// WritePlots draws, for each measured path, throughput against size on
// log-log axes, one panel per mode and in-flight count (pull x1, pull x8,
// push x1, ...): in each, the path as a solid line and each baseline it was
// measured against as a dashed line beside it, so a reader sees at a
// glance where the path stands against its own baseline. Panels share
// their axes; the legend sits outside them, on the right. It writes
// throughput-<path>.png into dir and returns the files written. Paths with
// fewer than two sizes are skipped (a line needs two points).
func WritePlots(dir string, recs []Record) ([]string, error) {
	var paths []string
	for _, r := range recs {
		if r.Kind == KindThroughput && r.Measured() && !slices.Contains(paths, r.Path) {
			paths = append(paths, r.Path)
		}
	}
	var files []string
	for _, path := range paths {
		f, err := writePathPlot(dir, path, recs)
		if err != nil {
			return files, err
		}
		if f != "" {
			files = append(files, f)
		}
	}
	return files, nil
}

// panelKey is one panel: a mode at one in-flight count.
type panelKey struct {
	mode string
	conc int
}

// line is one series of a panel: the path itself (baseline "") or one of
// its baselines.
type line struct {
	baseline string
	pts      map[int64]float64
}

func writePathPlot(dir, path string, recs []Record) (string, error) {
	var panels []panelKey
	lines := map[panelKey][]*line{}
	get := func(k panelKey, baseline string) *line {
		for _, l := range lines[k] {
			if l.baseline == baseline {
				return l
			}
		}
		l := &line{baseline: baseline, pts: map[int64]float64{}}
		lines[k] = append(lines[k], l)
		return l
	}
	var baselines []string
	lo, hi := math.Inf(1), math.Inf(-1)
	xlo, xhi := math.Inf(1), math.Inf(-1)
	note := func(size int64, g float64) {
		lo, hi = min(lo, g), max(hi, g)
		xlo, xhi = min(xlo, float64(size)), max(xhi, float64(size))
	}
	for _, r := range recs {
		if r.Kind != KindThroughput || !r.Measured() || r.Path != path {
			continue
		}
		k := panelKey{r.Mode, r.Concurrency}
		if !slices.Contains(panels, k) {
			panels = append(panels, k)
		}
		if r.GBps > 0 {
			get(k, "").pts[r.Size] = r.GBps
			note(r.Size, r.GBps)
		}
		if r.Baseline != "" && r.BaselineGBps > 0 {
			get(k, r.Baseline).pts[r.Size] = r.BaselineGBps
			note(r.Size, r.BaselineGBps)
			if !slices.Contains(baselines, r.Baseline) {
				baselines = append(baselines, r.Baseline)
			}
		}
	}
	// Only panels whose path line has two points are worth drawing.
	panels = slices.DeleteFunc(panels, func(k panelKey) bool { return len(get(k, "").pts) < 2 })
	if len(panels) == 0 {
		return "", nil
	}
	slices.SortStableFunc(panels, func(a, b panelKey) int {
		if a.mode != b.mode {
			return strings.Compare(modeOrder(a.mode), modeOrder(b.mode))
		}
		return a.conc - b.conc
	})
	var modes []string
	var concs []int
	for _, k := range panels {
		if !slices.Contains(modes, k.mode) {
			modes = append(modes, k.mode)
		}
		if !slices.Contains(concs, k.conc) {
			concs = append(concs, k.conc)
		}
	}
	slices.Sort(concs)

	// Colours: the path in one strong colour, each baseline its own,
	// dashed, the same in every panel and in the legend.
	style := func(baseline string) (color.Color, []vg.Length, draw.GlyphDrawer) {
		if baseline == "" {
			return color.RGBA{R: 0x1f, G: 0x5f, B: 0xbf, A: 0xff}, nil, draw.CircleGlyph{}
		}
		i := slices.Index(baselines, baseline)
		return plotutil.Color(i + 1), []vg.Length{vg.Points(5), vg.Points(3)}, plotutil.Shape(i + 1)
	}

	const panelW, panelH, legendW = 3.4 * vg.Inch, 2.6 * vg.Inch, 1.9 * vg.Inch
	cols, rows := len(concs), len(modes)
	img := vgimg.New(vg.Length(cols)*panelW+legendW, vg.Length(rows)*panelH+0.4*vg.Inch)
	dc := draw.New(img)
	// A title across the top.
	titleFont := plot.DefaultFont
	titleFont.Size = vg.Points(13)
	ts := draw.TextStyle{Color: color.Black, Font: titleFont, XAlign: draw.XCenter, YAlign: draw.YTop, Handler: plot.DefaultTextHandler}
	dc.FillText(ts, vg.Point{X: vg.Length(cols) * panelW / 2, Y: dc.Max.Y - vg.Points(4)},
		fmt.Sprintf("tensorlane %s against its baselines (same run); one panel per mode and in-flight count", path))

	for _, k := range panels {
		p := plot.New()
		p.Title.Text = fmt.Sprintf("%s %s, %d in flight", path, k.mode, k.conc)
		p.X.Label.Text = "size"
		p.Y.Label.Text = "GB/s"
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker = sizeTicks{}
		p.Y.Tick.Marker = rateTicks{}
		p.X.Min, p.X.Max = xlo, xhi
		p.Y.Min, p.Y.Max = lo/1.3, hi*1.3
		for _, l := range lines[k] {
			if len(l.pts) < 2 {
				continue
			}
			sizes := make([]int64, 0, len(l.pts))
			for sz := range l.pts {
				sizes = append(sizes, sz)
			}
			slices.Sort(sizes)
			xy := make(plotter.XYs, len(sizes))
			for j, sz := range sizes {
				xy[j] = plotter.XY{X: float64(sz), Y: l.pts[sz]}
			}
			ln, pts, err := plotter.NewLinePoints(xy)
			if err != nil {
				return "", err
			}
			c, dashes, shape := style(l.baseline)
			ln.Color, ln.Dashes, pts.Color, pts.Shape = c, dashes, c, shape
			if l.baseline == "" {
				ln.Width = vg.Points(2)
			}
			p.Add(ln, pts)
		}
		col, row := slices.Index(concs, k.conc), slices.Index(modes, k.mode)
		x0 := vg.Length(col) * panelW
		y1 := dc.Max.Y - 0.4*vg.Inch - vg.Length(row)*panelH
		p.Draw(draw.Crop(dc, x0, x0+panelW-dc.Max.X, y1-panelH, y1-dc.Max.Y))
	}

	// The legend, outside every plot area.
	lg := plot.NewLegend()
	lg.Top, lg.Left = true, true
	for _, b := range append([]string{""}, baselines...) {
		c, dashes, shape := style(b)
		ln := draw.LineStyle{Color: c, Width: vg.Points(1), Dashes: dashes}
		if b == "" {
			ln.Width = vg.Points(2)
		}
		name := path
		if b != "" {
			name = "baseline: " + b
		}
		lg.Add(" "+name, legendThumb{ln, draw.GlyphStyle{Color: c, Radius: vg.Points(2.5), Shape: shape}})
	}
	lx := vg.Length(cols)*panelW + vg.Points(8)
	lg.Draw(draw.Crop(dc, lx, 0, 0, -0.5*vg.Inch))

	f := filepath.Join(dir, "throughput-"+path+".png")
	out, err := os.Create(f)
	if err != nil {
		return "", err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return "", err
	}
	return f, out.Close()
}

// modeOrder puts pull before push before anything else.
func modeOrder(m string) string {
	switch m {
	case ModePull:
		return "0"
	case ModePush:
		return "1"
	}
	return "2" + m
}

// legendThumb draws a legend entry's line and glyph.
type legendThumb struct {
	line  draw.LineStyle
	glyph draw.GlyphStyle
}

func (t legendThumb) Thumbnail(c *draw.Canvas) {
	y := c.Center().Y
	c.StrokeLine2(t.line, c.Min.X, y, c.Max.X, y)
	c.DrawGlyph(t.glyph, c.Center())
}

// sizeTicks marks powers of two of bytes and labels powers of sixteen
// (4KiB, 64KiB, 1MiB, ...), which fit under a panel a third of a page wide.
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log2(lo)); e <= math.Ceil(math.Log2(hi)); e++ {
		v := math.Exp2(e)
		if v < lo || v > hi {
			continue
		}
		t := plot.Tick{Value: v}
		if int(e)%4 == 0 {
			t.Label = SizeString(int64(v))
		}
		ts = append(ts, t)
	}
	return ts
}

// rateTicks labels 1, 2 and 5 times each power of ten.
type rateTicks struct{}

func (rateTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log10(lo)); e <= math.Ceil(math.Log10(hi)); e++ {
		for _, m := range []float64{1, 2, 5} {
			v := m * math.Pow(10, e)
			if v >= lo && v <= hi {
				ts = append(ts, plot.Tick{Value: v, Label: strconv.FormatFloat(v, 'g', -1, 64)})
			}
		}
	}
	return ts
}
