package harness

import (
	"fmt"
	"math"
	"path/filepath"
	"slices"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
)

// WritePlots draws, for each measured path, throughput against size on
// log-log axes: one solid line per mode and in-flight count and a
// dashed line for each of its baselines. It writes throughput-<path>.png
// into dir and returns the files written. Paths with fewer than two sizes
// are skipped (a line needs two points).
func WritePlots(dir string, recs []Record) ([]string, error) {
	var paths []string
	for _, r := range recs {
		if r.Kind == KindThroughput && r.Measured() && !slices.Contains(paths, r.Path) {
			paths = append(paths, r.Path)
		}
	}
	var files []string
	for _, path := range paths {
		type series struct {
			name   string
			dashed bool
			pts    map[int64]float64
		}
		var order []string
		lines := map[string]*series{}
		add := func(name string, dashed bool, size int64, gbps float64) {
			s, ok := lines[name]
			if !ok {
				s = &series{name: name, dashed: dashed, pts: map[int64]float64{}}
				lines[name] = s
				order = append(order, name)
			}
			if gbps > 0 {
				s.pts[size] = gbps
			}
		}
		for _, r := range recs {
			if r.Kind != KindThroughput || !r.Measured() || r.Path != path {
				continue
			}
			add(fmt.Sprintf("%s %s x%d", path, r.Mode, r.Concurrency), false, r.Size, r.GBps)
			add(fmt.Sprintf("%s x%d", r.Baseline, r.Concurrency), true, r.Size, r.BaselineGBps)
		}
		p := plot.New()
		p.Title.Text = fmt.Sprintf("tensorlane %s (pull and push) vs baselines", path)
		p.X.Label.Text = "size"
		p.Y.Label.Text = "GB/s"
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker = sizeTicks{}
		p.Y.Tick.Marker = rateTicks{}
		p.Legend.Top = true
		p.Legend.Left = true
		drawn := 0
		for i, name := range order {
			s := lines[name]
			if len(s.pts) < 2 {
				continue
			}
			sizes := make([]int64, 0, len(s.pts))
			for sz := range s.pts {
				sizes = append(sizes, sz)
			}
			slices.Sort(sizes)
			xy := make(plotter.XYs, len(sizes))
			for j, sz := range sizes {
				xy[j] = plotter.XY{X: float64(sz), Y: s.pts[sz]}
			}
			l, pts, err := plotter.NewLinePoints(xy)
			if err != nil {
				return files, err
			}
			l.Color = plotutil.Color(i)
			pts.Color = l.Color
			pts.Shape = plotutil.Shape(i)
			if s.dashed {
				l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
			}
			p.Add(l, pts)
			p.Legend.Add(name, l, pts)
			drawn++
		}
		if drawn == 0 {
			continue
		}
		f := filepath.Join(dir, "throughput-"+path+".png")
		if err := p.Save(7*vg.Inch, 4.5*vg.Inch, f); err != nil {
			return files, err
		}
		files = append(files, f)
	}
	return files, nil
}

// sizeTicks labels powers of four of bytes as 4KiB, 16KiB, ... 1GiB.
type sizeTicks struct{}

func (sizeTicks) Ticks(lo, hi float64) []plot.Tick {
	var ts []plot.Tick
	for e := math.Floor(math.Log2(lo)); e <= math.Ceil(math.Log2(hi)); e++ {
		v := math.Exp2(e)
		if v < lo || v > hi {
			continue
		}
		t := plot.Tick{Value: v}
		if int(e)%2 == 0 {
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
