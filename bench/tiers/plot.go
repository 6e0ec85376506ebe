package tiers

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

// Plot draws the history as two panels over run number: step seconds,
// and every other figure relative to its own median over the history (so
// ratios, A/B ratios and counts share an axis, and a drift of 10% reads as
// 0.9 whatever the figure). It writes a PNG to file.
func Plot(file, tier string, hist []Summary) error {
	if len(hist) == 0 {
		return fmt.Errorf("tiers: no history to plot")
	}
	series := map[string]plotter.XYs{}
	for i, s := range hist {
		for k, v := range s.Figures {
			series[k] = append(series[k], plotter.XY{X: float64(i + 1), Y: v})
		}
	}
	var secs, rel []string
	for k := range series {
		if strings.HasPrefix(k, "seconds/") {
			secs = append(secs, k)
		} else {
			rel = append(rel, k)
		}
	}
	sort.Strings(secs)
	sort.Strings(rel)
	top, err := panel(tier+": step seconds per run", "seconds", secs, series, false)
	if err != nil {
		return err
	}
	bottom, err := panel(tier+": figures relative to their median", "relative", rel, series, true)
	if err != nil {
		return err
	}
	const w, h = 12 * vg.Inch, 10 * vg.Inch
	img := vgimg.New(w, h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: 2, Cols: 1, PadY: vg.Centimeter}
	canv := plot.Align([][]*plot.Plot{{top}, {bottom}}, tiles, dc)
	top.Draw(canv[0][0])
	bottom.Draw(canv[1][0])
	return savePNG(file, img)
}

func panel(title, ylabel string, keys []string, series map[string]plotter.XYs, relative bool) (*plot.Plot, error) {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "run"
	p.Y.Label.Text = ylabel
	p.Legend.Top = true
	p.Legend.Left = true
	for i, k := range keys {
		xy := series[k]
		if relative {
			xy = relativeTo(xy)
		}
		l, err := plotter.NewLine(xy)
		if err != nil {
			return nil, err
		}
		l.Color = plotutil.Color(i)
		l.Dashes = plotutil.Dashes(i / 7)
		p.Add(l)
		if len(keys) <= 12 { // more would hide the lines
			p.Legend.Add(k, l)
		}
	}
	return p, nil
}

// relativeTo divides a series by its median.
func relativeTo(xy plotter.XYs) plotter.XYs {
	ys := make([]float64, len(xy))
	for i, p := range xy {
		ys[i] = p.Y
	}
	sort.Float64s(ys)
	m := ys[len(ys)/2]
	out := make(plotter.XYs, len(xy))
	for i, p := range xy {
		out[i] = p
		if m != 0 {
			out[i].Y = p.Y / m
		}
	}
	return out
}

func savePNG(file string, img *vgimg.Canvas) error {
	if err := os.MkdirAll(filepath.Dir(file), 0o755); err != nil {
		return err
	}
	out, err := os.Create(file)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(out); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}
