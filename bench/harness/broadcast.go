package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"time"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// PathBroadcast is the broadcast path: one owner, N readers' slots spread
// over simulated hosts, measured as the time for N over the time for 1.
const PathBroadcast = "broadcast"

// BroadcastConfig selects the broadcast measurements; the zero value means
// the defaults.
type BroadcastConfig struct {
	// Sizes of the object broadcast. Default 64 MiB.
	Sizes []int64
	// Readers counts to measure. Default 1, 2, 4, 8, 16.
	Readers []int
	// Transports between hosts: "rdma", "tcp". Default both.
	Transports []string
	// Hosts is the number of simulated hosts (one runtime each, the owner
	// on h0); readers are spread over them round robin, h1 first. Default 4.
	Hosts int
	// Rounds per cell; the median is kept. Default 3.
	Rounds int
	// ChunkSize is the broadcast's pipelining unit (0: rdt's default).
	ChunkSize int64
	// Windows are the chunks in flight per tree edge to measure (0:
	// rdt's default), each cell against the one-reader time of its own
	// window, rounds interleaved across them. Default: rdt's only.
	Windows []int
	// Naive also times N separate pushes (today's way) per cell.
	Naive bool
	// MaxBytes bounds size × readers per cell (the readers' slots);
	// larger cells are skipped. Default 4 GiB.
	MaxBytes int64
}

// BroadcastRecord is one cell: a size broadcast to N readers.
type BroadcastRecord struct {
	Path        string  `json:"path"` // "broadcast"
	Transport   string  `json:"transport"`
	Readers     int     `json:"readers"`
	Hosts       int     `json:"hosts"`
	Size        int64   `json:"size"`
	Window      int     `json:"window,omitempty"` // chunks in flight per tree edge; 0: rdt's default
	Seconds     float64 `json:"seconds"`
	RatioVsOne  float64 `json:"ratio_vs_one"`
	ColdSeconds float64 `json:"cold_seconds"`           // the first round, into fresh reader memory
	Naive       float64 `json:"naive_seconds,omitzero"` // N pushes one after another
	NaiveRatio  float64 `json:"naive_ratio_vs_one,omitzero"`
	Status      string  `json:"status,omitempty"`
	Note        string  `json:"note,omitempty"`
	// Load is the machine's 1-minute load average before and after the
	// cell ("3.10 -> 4.25"), where the run kept it: on a machine shared
	// with other work it says how much of the cores the cell had.
	Load string `json:"load,omitempty"`
}

func (c BroadcastConfig) withDefaults() BroadcastConfig {
	if c.Sizes == nil {
		c.Sizes = []int64{64 << 20}
	}
	if c.Readers == nil {
		c.Readers = []int{1, 2, 4, 8, 16}
	}
	if c.Transports == nil {
		c.Transports = []string{"rdma", "tcp"}
	}
	if c.Hosts <= 0 {
		c.Hosts = 4
	}
	if c.Rounds <= 0 {
		c.Rounds = 3
	}
	if c.Windows == nil {
		c.Windows = []int{0}
	}
	if c.MaxBytes <= 0 {
		c.MaxBytes = 4 << 30
	}
	return c
}

// RunBroadcast measures broadcast on a simulated cluster of cfg.Hosts
// dgx-h100 hosts in this process, one runtime per host, for each
// transport between hosts (readers on one host are fed by that host's first
// reader, a copy between simulated GPUs of one runtime). Each cell's ratio
// is its median time over the median time of one reader in the same run.
func RunBroadcast(ctx context.Context, cfg BroadcastConfig, progress func(BroadcastRecord)) ([]BroadcastRecord, error) {
	cfg = cfg.withDefaults()
	var out []BroadcastRecord
	for _, tr := range cfg.Transports {
		if tr != "rdma" && tr != "tcp" {
			return out, fmt.Errorf("harness: broadcast transport %q (want rdma or tcp)", tr)
		}
		for _, size := range cfg.Sizes {
			recs, err := runBroadcastCells(ctx, cfg, tr, size, progress)
			out = append(out, recs...)
			if err != nil {
				return out, err
			}
		}
	}
	return out, nil
}

func runBroadcastCells(ctx context.Context, cfg BroadcastConfig, tr string, size int64, progress func(BroadcastRecord)) (out []BroadcastRecord, err error) {
	cl, err := topology.Preset("dgx-h100", cfg.Hosts)
	if err != nil {
		return nil, err
	}
	maxReaders := slices.Max(cfg.Readers)
	perHost := (maxReaders + cfg.Hosts - 1) / cfg.Hosts
	var rts []*rdt.Runtime
	defer func() {
		for _, r := range rts {
			if cerr := r.Shutdown(context.Background()); err == nil {
				err = cerr
			}
		}
	}()
	for i := range cfg.Hosts {
		c := rdt.Config{Cluster: cl, Host: cl.Hosts[i].ID, IgnoreEnv: true, RuntimeDir: rdt.ProcessRuntimeDir(), DeviceMemory: size + 16<<20}
		if tr == "tcp" {
			c.Transports.Deny = []string{"rdma"}
		}
		r, err := rdt.New(ctx, c)
		if err != nil {
			return nil, err
		}
		rts = append(rts, r)
		if i > 0 {
			if err := r.Connect(ctx, rts[0].AddrInfo()); err != nil {
				return nil, err
			}
		}
	}
	owner, err := rts[0].Spawn("trainer")
	if err != nil {
		return nil, err
	}
	mem, err := rts[0].Memory(srcDev)
	if err != nil {
		return nil, err
	}
	x, err := tensor.Alloc(ctx, mem, tensor.Uint8, size)
	if err != nil {
		return nil, err
	}
	p, _ := x.SpanBytes()
	fillPattern(p)
	src, err := owner.Put(ctx, x)
	if err != nil {
		x.Release()
		return nil, err
	}
	defer owner.Free(context.Background(), src)
	// The readers' slots: reader k on host (k+1) mod Hosts, GPUs in turn
	// (on h0 from GPU 1: the owner has GPU 0).
	var slots []*rdt.Slot
	defer func() {
		for _, s := range slots {
			s.Close()
		}
	}()
	actors := map[int]*rdt.Actor{}
	for k := range min(maxReaders, perHost*cfg.Hosts) {
		h := (k + 1) % cfg.Hosts
		a, ok := actors[h]
		if !ok {
			if a, err = rts[h].Spawn("worker"); err != nil {
				return nil, err
			}
			actors[h] = a
		}
		dev := k / cfg.Hosts
		if h == 0 {
			dev++
		}
		if int64(k+1)*size > cfg.MaxBytes {
			break
		}
		s, err := a.Reserve(ctx, src.Desc, tensor.GPUDevice(dev))
		if err != nil {
			return nil, fmt.Errorf("harness: reserve reader %d: %w", k, err)
		}
		slots = append(slots, s)
	}
	// Rounds are interleaved across the reader counts and windows (round
	// 1 for every cell, then round 2...), so load from elsewhere on the
	// machine shifts every cell alike and the ratios hold; round 0 is the
	// cold one.
	var cells []*BroadcastRecord
	times := map[*BroadcastRecord][]float64{}
	naive := map[*BroadcastRecord][]float64{}
	for _, w := range cfg.Windows {
		for _, n := range cfg.Readers {
			rec := &BroadcastRecord{Path: PathBroadcast, Transport: tr, Readers: n, Hosts: cfg.Hosts, Size: size, Window: w}
			if n > len(slots) {
				rec.Status, rec.Note = StatusSkipped, fmt.Sprintf("%d readers × %s exceed MaxBytes %s", n, SizeString(size), SizeString(cfg.MaxBytes))
			}
			cells = append(cells, rec)
		}
	}
	refsOf := func(n int) []rdt.Ref {
		refs := make([]rdt.Ref, n)
		for i := range n {
			refs[i] = slots[i].Ref()
		}
		return refs
	}
	for round := range cfg.Rounds + 1 {
		for _, rec := range cells {
			if rec.Status != "" {
				continue
			}
			n := rec.Readers
			refs := refsOf(n)
			start := time.Now()
			res, err := owner.Broadcast(ctx, src, refs, rdt.BroadcastConfig{ChunkSize: cfg.ChunkSize, Window: rec.Window})
			if err != nil {
				return out, err
			}
			if err := res.Err(); err != nil {
				return out, fmt.Errorf("harness: broadcast %s to %d: %w", SizeString(size), n, err)
			}
			d := time.Since(start).Seconds()
			if round == 0 {
				rec.ColdSeconds = d // into slot pages no broadcast touched before (as far as the readers before it left them)
				if err := verifySlots(ctx, slots[:n], p); err != nil {
					return out, err
				}
				continue
			}
			times[rec] = append(times[rec], d)
			if cfg.Naive && rec == cellFor(cells, rec.Readers) {
				start := time.Now()
				for _, r := range refs {
					if _, err := owner.Push(ctx, src, r); err != nil {
						return out, err
					}
				}
				naive[rec] = append(naive[rec], time.Since(start).Seconds())
			}
		}
	}
	var one, oneNaive float64
	for i, rec := range cells {
		if i > 0 && rec.Window != cells[i-1].Window {
			one = 0 // each window against its own one reader
		}
		if rec.Status == "" {
			rec.Seconds, rec.Naive = median(times[rec]), median(naive[rec])
			if rec.Readers == 1 {
				one = rec.Seconds
				if rec.Naive > 0 {
					oneNaive = rec.Naive
				}
			}
			if one > 0 {
				rec.RatioVsOne = rec.Seconds / one
			}
			if rec.Naive > 0 && oneNaive > 0 {
				rec.NaiveRatio = rec.Naive / oneNaive
			}
		}
		out = append(out, *rec)
		if progress != nil {
			progress(*rec)
		}
	}
	return out, nil
}

// cellFor is the first cell (the first window's) for n readers: N pushes
// do not depend on the window, so they are timed there only.
func cellFor(cells []*BroadcastRecord, n int) *BroadcastRecord {
	for _, c := range cells {
		if c.Readers == n {
			return c
		}
	}
	return nil
}

func fillPattern(p []byte) {
	for i := range min(len(p), 1<<16) {
		p[i] = byte(i*131 + i>>9)
	}
	for done := 1 << 16; done < len(p); done *= 2 {
		copy(p[done:], p[:done])
	}
}

func verifySlots(ctx context.Context, slots []*rdt.Slot, want []byte) error {
	for i, s := range slots {
		_, x, err := s.Wait(ctx, 0)
		if err != nil {
			return err
		}
		got, err := x.SpanBytes()
		if err != nil {
			return err
		}
		if !slices.Equal(got, want) {
			return fmt.Errorf("harness: broadcast reader %d holds other bytes than the owner's", i)
		}
	}
	return nil
}

// WriteBroadcastJSON writes one JSON object per record.
func WriteBroadcastJSON(w io.Writer, recs []BroadcastRecord) error {
	enc := json.NewEncoder(w)
	for _, r := range recs {
		if err := enc.Encode(r); err != nil {
			return err
		}
	}
	return nil
}

// WriteBroadcastTable writes the records as a Markdown table.
func WriteBroadcastTable(w io.Writer, recs []BroadcastRecord) error {
	if _, err := fmt.Fprintln(w, "| transport | size | window | readers | seconds | ratio vs 1 | cold s | N pushes s | N pushes ratio |\n|---|---|---|---|---|---|---|---|---|"); err != nil {
		return err
	}
	for _, r := range recs {
		if r.Status != "" {
			fmt.Fprintf(w, "| %s | %s | %s | %d | %s: %s | | | | |\n", r.Transport, SizeString(r.Size), windowString(r.Window), r.Readers, r.Status, r.Note)
			continue
		}
		naive, nr := "", ""
		if r.Naive > 0 {
			naive, nr = fmt.Sprintf("%.3f", r.Naive), fmt.Sprintf("%.2f", r.NaiveRatio)
		}
		if _, err := fmt.Fprintf(w, "| %s | %s | %s | %d | %.3f | %.2f | %.3f | %s | %s |\n", r.Transport, SizeString(r.Size), windowString(r.Window), r.Readers, r.Seconds, r.RatioVsOne, r.ColdSeconds, naive, nr); err != nil {
			return err
		}
	}
	return nil
}

func windowString(w int) string {
	if w == 0 {
		return "default"
	}
	return fmt.Sprint(w)
}

// WriteBroadcastPlot draws time against readers, one line per transport and
// size (and the N-pushes way, dashed, where measured), into
// dir/broadcast.png.
func WriteBroadcastPlot(dir string, recs []BroadcastRecord) (string, error) {
	f := filepath.Join(dir, "broadcast.png")
	return f, WriteBroadcastPlotFile(f, "tensorlane broadcast: time against readers (4 simulated hosts in one process)", recs)
}

// WriteBroadcastPlotFile is WriteBroadcastPlot into file, with a title.
func WriteBroadcastPlotFile(file, title string, recs []BroadcastRecord) error {
	type key struct {
		name   string
		dashed bool
	}
	lines := map[key]plotter.XYs{}
	var order []key
	add := func(k key, x int, y float64) {
		if _, ok := lines[k]; !ok {
			order = append(order, k)
		}
		lines[k] = append(lines[k], plotter.XY{X: float64(x), Y: y})
	}
	for _, r := range recs {
		if r.Status != "" {
			continue
		}
		name := fmt.Sprintf("broadcast %s %s", r.Transport, SizeString(r.Size))
		if r.Window != 0 {
			name += fmt.Sprintf(" window %d", r.Window)
		}
		add(key{name, false}, r.Readers, r.Seconds)
		if r.Naive > 0 {
			add(key{fmt.Sprintf("N pushes / Gets %s %s", r.Transport, SizeString(r.Size)), true}, r.Readers, r.Naive)
		}
	}
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = "readers"
	p.Y.Label.Text = "seconds"
	p.Legend.Top, p.Legend.Left = true, true
	for i, k := range order {
		l, pts, err := plotter.NewLinePoints(lines[k])
		if err != nil {
			return err
		}
		l.Color = plotutil.Color(i)
		pts.Color, pts.Shape = l.Color, plotutil.Shape(i)
		if k.dashed {
			l.Dashes = []vg.Length{vg.Points(5), vg.Points(3)}
		}
		p.Add(l, pts)
		p.Legend.Add(k.name, l, pts)
	}
	return p.Save(7*vg.Inch, 4.5*vg.Inch, file)
}
