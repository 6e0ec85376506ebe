package ab

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tensorlane/tensorlane/bench/harness"
)

// Errors, for errors.Is.
var (
	// ErrBadConfig: the comparison cannot start as configured.
	ErrBadConfig = errors.New("ab: bad configuration")
	// ErrMeasure: a build failed to measure a cell (its output says why).
	ErrMeasure = errors.New("ab: a build failed to measure a cell")
	// ErrRegressed: the verdict names at least one regressed cell.
	ErrRegressed = errors.New("ab: head regressed")
)

// Build is one side of the comparison: an executable of tensorlane and
// the environment its bench runs get on top of this process's.
type Build struct {
	Name string   // what the verdict calls it (a revision, a path)
	Exe  string   // the tensorlane executable
	Env  []string // KEY=VALUE added to its runs (e.g. an injected slowdown)
}

// Cell is one cell of the matrix.
type Cell struct {
	Path        string
	Mode        string // harness.ModePull or harness.ModePush
	Size        int64
	Concurrency int
}

func (c Cell) String() string {
	return fmt.Sprintf("%s/%s/%s/c%d", c.Path, c.Mode, harness.SizeString(c.Size), c.Concurrency)
}

// QuickCells is the quick A/B matrix: every path that moves bytes, at
// 1 MiB with one transfer in flight, pulled, and pushed where push has a
// mechanism of its own (p2p-ipc's cross-process copy, rdma's WRITE).
// "local" (a zero-copy view) is left out: it times bookkeeping, not a
// path; so are 64 MiB cells: on a loaded 2-core machine a sample of them
// spread 8 times wider than at 1 MiB (memory bandwidth is what the other
// load takes), too wide to see 10% in minutes.
func QuickCells() []Cell {
	const mib = 1 << 20
	var cs []Cell
	for _, p := range []string{harness.PathP2P, harness.PathP2PIPC, harness.PathSHM, harness.PathRDMA, harness.PathTCP} {
		cs = append(cs, Cell{Path: p, Mode: harness.ModePull, Size: mib, Concurrency: 1})
	}
	for _, p := range []string{harness.PathP2PIPC, harness.PathRDMA} {
		cs = append(cs, Cell{Path: p, Mode: harness.ModePush, Size: mib, Concurrency: 1})
	}
	return cs
}

// Modes of measuring.
const (
	// ModeServe keeps one process of each build serving the cell
	// (bench --ab-serve) and alternates single rounds between them, a few
	// milliseconds apart: the pairs see the same load.
	ModeServe = "serve"
	// ModeProcess runs a whole bench process per sample: for a base built
	// before --ab-serve existed.
	ModeProcess = "process"
)

// Metrics a cell can be compared on.
const (
	// MetricWall (ModeServe) is the rate of a round by the wall clock.
	MetricWall = "wall"
	// MetricCPU (ModeServe) is bytes per second of the serving process's
	// CPU time in a round: what the path costs.
	MetricCPU = "cpu"
	// MetricRatio is the cell's ratio against its same-run baseline
	// (memcpy on one host, raw TCP across hosts): load that slows the
	// machine slows both, so the ratio moves less than the rate.
	MetricRatio = "ratio"
	// MetricGBps is the path's own rate over all its rounds.
	MetricGBps = "gbps"
	// MetricMedianGBps is the path's rate in its median round.
	MetricMedianGBps = "median-gbps"
	// MetricBestGBps is the path's rate in its fastest round.
	MetricBestGBps = "best-gbps"
)

// Config is one comparison. The zero value of every field but Base and
// Head means the documented default.
type Config struct {
	Base, Head Build
	Cells      []Cell // default QuickCells
	// Reps is the pairs of samples per cell (default 40): each pair is a
	// fresh process of each build serving the cell (a run of each, in
	// ModeProcess), the two alternating round by round.
	Reps int
	// Alpha is the chance of a false alarm over the whole matrix
	// (default 0.05); each cell's interval is at 1-Alpha/len(Cells)
	// (Bonferroni), so a bigger matrix does not cry wolf more often.
	Alpha float64
	// Threshold is the least slip a verdict names (default 0.03): a cell
	// regressed when its whole interval lies below 1 and its estimate
	// below 1-Threshold.
	Threshold float64
	// Mode is ModeServe (default) or ModeProcess.
	Mode string
	// Rounds is, in ModeServe, the rounds of each build a pair's sample
	// is the median of (default 21; fewer for cells over 1 MiB, whose
	// rounds are longer).
	Rounds int
	// Quantile is, in ModeServe, the quantile of a sample's round rates
	// taken as the sample (default 0.5, the median; 1 the fastest round).
	Quantile float64
	// Metric is, in ModeServe, MetricWall (default) or MetricCPU; in
	// ModeProcess one of the bench record's (default MetricRatio).
	Metric    string
	MinTime   time.Duration // ModeProcess: per run of a cell (default 100ms)
	MinRounds int           // ModeProcess: per run of a cell (default 5)
	// Timeout bounds one run of a cell (default 2m).
	Timeout time.Duration
	// Progress, when set, gets a line per cell as it finishes.
	Progress io.Writer
	// open replaces starting a build (tests of the statistics).
	open func(ctx context.Context, b Build, c Cell) (session, error)
}

func (c *Config) defaults() error {
	if c.Base.Exe == "" || c.Head.Exe == "" {
		return fmt.Errorf("%w: base and head need an executable", ErrBadConfig)
	}
	if len(c.Cells) == 0 {
		c.Cells = QuickCells()
	}
	if c.Reps == 0 {
		c.Reps = 40
	}
	if c.Alpha == 0 {
		c.Alpha = 0.05
	}
	if c.Threshold == 0 {
		c.Threshold = 0.03
	}
	if c.Mode == "" {
		c.Mode = ModeServe
	}
	if c.Quantile == 0 {
		c.Quantile = 0.5
	}
	if c.Rounds == 0 {
		c.Rounds = 21
	}
	if c.Metric == "" {
		c.Metric = MetricWall
		if c.Mode == ModeProcess {
			c.Metric = MetricRatio
		}
	}
	if c.MinTime == 0 {
		c.MinTime = 100 * time.Millisecond
	}
	if c.MinRounds == 0 {
		c.MinRounds = 5
	}
	if c.Timeout == 0 {
		c.Timeout = 2 * time.Minute
	}
	switch {
	case c.Reps < 6:
		// Fewer pairs cannot reach a per-cell confidence of 99% at all.
		return fmt.Errorf("%w: --reps %d: at least 6 pairs per cell", ErrBadConfig, c.Reps)
	case !(c.Alpha > 0 && c.Alpha < 1):
		return fmt.Errorf("%w: alpha %g not in (0, 1)", ErrBadConfig, c.Alpha)
	case !(c.Threshold >= 0 && c.Threshold < 1):
		return fmt.Errorf("%w: threshold %g not in [0, 1)", ErrBadConfig, c.Threshold)
	case c.Mode != ModeServe && c.Mode != ModeProcess:
		return fmt.Errorf("%w: mode %q (serve or process)", ErrBadConfig, c.Mode)
	case !(c.Quantile > 0 && c.Quantile <= 1):
		return fmt.Errorf("%w: quantile %g not in (0, 1]", ErrBadConfig, c.Quantile)
	case c.Rounds < 1:
		return fmt.Errorf("%w: rounds %d < 1", ErrBadConfig, c.Rounds)
	case c.Mode == ModeServe && c.Metric != MetricWall && c.Metric != MetricCPU:
		return fmt.Errorf("%w: metric %q with mode serve (wall or cpu)", ErrBadConfig, c.Metric)
	case c.Mode == ModeProcess && !slices.Contains([]string{MetricRatio, MetricGBps, MetricMedianGBps, MetricBestGBps}, c.Metric):
		return fmt.Errorf("%w: metric %q with mode process (ratio, gbps, median-gbps or best-gbps)", ErrBadConfig, c.Metric)
	}
	return nil
}

// Verdicts of a cell.
const (
	Same      = "same"
	Regressed = "REGRESSED"
	Improved  = "improved"
)

// CellResult is one cell's samples and verdict.
type CellResult struct {
	Cell     string    `json:"cell"`
	Base     []float64 `json:"base"`
	Head     []float64 `json:"head"`
	Ratio    float64   `json:"ratio"` // head/base, higher is better
	Lo       float64   `json:"lo"`
	Hi       float64   `json:"hi"`
	Conf     float64   `json:"confidence"`
	P        float64   `json:"p"`
	Verdict  string    `json:"verdict"`
	Duration float64   `json:"seconds"`
}

// Report is the whole comparison.
type Report struct {
	Base      string       `json:"base"`
	Head      string       `json:"head"`
	Metric    string       `json:"metric"`
	Reps      int          `json:"reps"`
	Alpha     float64      `json:"alpha"`
	Threshold float64      `json:"threshold"`
	Cells     []CellResult `json:"cells"`
	Seconds   float64      `json:"seconds"`
}

// Regressed lists the cells whose verdict is Regressed.
func (r Report) Regressed() []CellResult {
	var out []CellResult
	for _, c := range r.Cells {
		if c.Verdict == Regressed {
			out = append(out, c)
		}
	}
	return out
}

// Err is nil, or ErrRegressed naming every regressed cell with its ratio
// and interval.
func (r Report) Err() error {
	reg := r.Regressed()
	if len(reg) == 0 {
		return nil
	}
	parts := make([]string, len(reg))
	for i, c := range reg {
		parts[i] = fmt.Sprintf("%s %.3f [%.3f, %.3f] at %.1f%%", c.Cell, c.Ratio, c.Lo, c.Hi, 100*c.Conf)
	}
	return fmt.Errorf("%w: %s", ErrRegressed, strings.Join(parts, "; "))
}

// Run measures every cell with both builds, interleaved pair by pair, and
// gives each cell a verdict. A build that fails to measure ends the run
// with ErrMeasure: a comparison with holes in it proves nothing.
func Run(ctx context.Context, cfg Config) (Report, error) {
	if err := cfg.defaults(); err != nil {
		return Report{}, err
	}
	open := cfg.open
	if open == nil {
		open = cfg.openSession
	}
	rep := Report{Base: cfg.Base.Name, Head: cfg.Head.Name, Metric: cfg.Metric, Reps: cfg.Reps,
		Alpha: cfg.Alpha, Threshold: cfg.Threshold}
	began := time.Now()
	conf := 1 - cfg.Alpha/float64(len(cfg.Cells))
	for _, cell := range cfg.Cells {
		start := time.Now()
		cr := CellResult{Cell: cell.String()}
		if err := cfg.sampleCell(ctx, open, cell, &cr); err != nil {
			return rep, err
		}
		e := Paired(cr.Base, cr.Head, conf)
		cr.Ratio, cr.Lo, cr.Hi, cr.Conf, cr.P = e.Ratio, e.Lo, e.Hi, e.Confidence, e.P
		switch {
		case e.Hi < 1 && e.Ratio < 1-cfg.Threshold:
			cr.Verdict = Regressed
		case e.Lo > 1 && e.Ratio > 1+cfg.Threshold:
			cr.Verdict = Improved
		default:
			cr.Verdict = Same
		}
		cr.Duration = time.Since(start).Seconds()
		rep.Cells = append(rep.Cells, cr)
		if cfg.Progress != nil {
			fmt.Fprintf(cfg.Progress, "ab: %-24s %s\n", cr.Cell, cr.line())
		}
	}
	rep.Seconds = time.Since(began).Seconds()
	return rep, nil
}

func (c CellResult) line() string {
	return fmt.Sprintf("%.3f [%.3f, %.3f] %4.1f%%  p=%.4f  %s", c.Ratio, c.Lo, c.Hi, 100*c.Conf, c.P, c.Verdict)
}

// Write prints the verdict table.
func (r Report) Write(w io.Writer) {
	fmt.Fprintf(w, "A/B: base %s, head %s; %s, %d interleaved pairs per cell; interval per cell at 1-%.2g/%d (Bonferroni); a regression is an interval below 1 and a slip over %.0f%%\n",
		r.Base, r.Head, r.Metric, r.Reps, r.Alpha, len(r.Cells), 100*r.Threshold)
	fmt.Fprintf(w, "%-24s %-7s %-17s %-6s %-8s %s\n", "CELL", "HEAD/BASE", "INTERVAL", "CONF", "P", "VERDICT")
	for _, c := range r.Cells {
		fmt.Fprintf(w, "%-24s %-9.3f [%.3f, %.3f]  %5.1f%% %-8.4f %s\n", c.Cell, c.Ratio, c.Lo, c.Hi, 100*c.Conf, c.P, c.Verdict)
	}
	if reg := r.Regressed(); len(reg) > 0 {
		fmt.Fprintf(w, "FAIL: %d of %d cells regressed (took %.0f s)\n", len(reg), len(r.Cells), r.Seconds)
	} else {
		fmt.Fprintf(w, "PASS: no cell regressed (took %.0f s)\n", r.Seconds)
	}
}

// runCell runs b's bench on one cell and returns the metric. The flags
// are the bench command's since before this package existed, so an older
// revision can be a base.
func (cfg *Config) runCell(ctx context.Context, b Build, c Cell) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.Timeout)
	defer cancel()
	paths, push := c.Path, ""
	if c.Mode == harness.ModePush {
		paths, push = "", c.Path
	}
	args := []string{"bench", "--paths=" + paths, "--push=" + push, "--sizes", harness.SizeString(c.Size),
		"--concurrency", strconv.Itoa(c.Concurrency), "--no-latency", "--json",
		"--min-time", cfg.MinTime.String(), "--min-rounds", strconv.Itoa(cfg.MinRounds)}
	cmd := exec.CommandContext(ctx, b.Exe, args...)
	cmd.Env = append(os.Environ(), b.Env...)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	cmd.WaitDelay = 5 * time.Second
	if err := cmd.Run(); err != nil {
		return 0, fmt.Errorf("%s %s: %w: %s", b.Exe, strings.Join(args, " "), err, lastLine(errb.String()))
	}
	sc := bufio.NewScanner(&out)
	sc.Buffer(make([]byte, 1<<16), 1<<20)
	for sc.Scan() {
		var r harness.Record
		if json.Unmarshal(sc.Bytes(), &r) != nil || r.Kind != harness.KindThroughput {
			continue
		}
		if r.Path != c.Path || r.Mode != c.Mode || r.Size != c.Size || r.Concurrency != c.Concurrency || !r.Measured() {
			continue
		}
		// The first record of a cell is against its primary baseline
		// (memcpy or raw TCP).
		v := r.Ratio
		switch cfg.Metric {
		case MetricGBps:
			v = r.GBps
		case MetricMedianGBps:
			v = r.MedianGBps
		case MetricBestGBps:
			v = r.BestGBps
		}
		if !(v > 0) || math.IsInf(v, 0) {
			return 0, fmt.Errorf("%s measured %g", c, v)
		}
		return v, nil
	}
	return 0, fmt.Errorf("%s printed no record of %s: %s", b.Exe, c, lastLine(errb.String()))
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		s = s[i+1:]
	}
	return s
}
