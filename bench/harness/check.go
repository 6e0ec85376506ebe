package harness

import (
	"context"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"
)

// DefaultTolerance is the fraction a ratio may fall below the stored
// baseline's ratio before Check calls it a regression.
const DefaultTolerance = 0.25

// MaxCellTolerance caps the per-cell tolerance Median derives from the
// spread of runs: a cell may be noisy, but a halved ratio still fails.
const MaxCellTolerance = 0.5

// NoiseFloor is the least tolerance a baseline cell gets for what it
// measures, and why. Interleaving cancels drift, not CPU contention: when
// other work takes the cores, a path that needs several goroutines (8 in
// flight, or the network paths' many connections at sizes where they are
// latency-bound, or striped over several connections at any size) loses
// more than its single-thread baseline, and its ratio drops by a third with
// no change in the code (seen on the shared 2-core machine with other
// processes spinning). Those cells get a wider band; bandwidth-bound
// on-host cells (64 MiB, 1 in flight) keep DefaultTolerance, and a wrong
// path is caught outright by ErrWrongPath, not by a ratio.
func NoiseFloor(r Record) (float64, string) {
	switch {
	case r.Kind == KindLatency:
		return 0.45, "latency: scheduling-bound under contention"
	case r.Concurrency > 1:
		return 0.45, fmt.Sprintf("%d in flight: scheduling-bound under contention", r.Concurrency)
	case network(r.Path) && r.Size <= 1<<20:
		return 0.45, "network path at <= 1 MiB: latency-bound under contention"
	case network(r.Path):
		return 0.35, "network path striped over several connections or rails: needs more cores than its one-stream baseline"
	case r.Path == PathLocal:
		// A view against a copy: the ratio is copy time over bookkeeping
		// time, and the bookkeeping is a few microseconds of scheduling.
		return 0.45, "zero-copy view: ratio of a copy to microseconds of bookkeeping"
	}
	return 0, ""
}

// Regression is one cell whose ratio fell too far, or that the current run
// no longer measures.
type Regression struct {
	Key       string
	Baseline  float64 // the stored ratio
	Current   float64 // the measured ratio; 0 when Missing
	Tolerance float64 // the tolerance applied to this cell
	Missing   bool
}

func (r Regression) String() string {
	if r.Missing {
		return fmt.Sprintf("%s: in the baseline (ratio %.3g) but not measured in this run", r.Key, r.Baseline)
	}
	return fmt.Sprintf("%s: ratio %.3g, baseline %.3g (%+.0f%%, tolerance %.0f%%)", r.Key, r.Current, r.Baseline, 100*(r.Current/r.Baseline-1), 100*r.Tolerance)
}

// CheckResult is the outcome of comparing a run with a stored baseline.
type CheckResult struct {
	Tolerance   float64
	Compared    int
	Regressions []Regression
	// New lists measured cells the baseline does not have (not a failure).
	New []string
}

// OK reports whether no ratio regressed and nothing went missing.
func (c CheckResult) OK() bool { return len(c.Regressions) == 0 }

// Error lists every regression, one a line; nil when OK.
func (c CheckResult) Error() error {
	if c.OK() {
		return nil
	}
	lines := make([]string, len(c.Regressions))
	for i, r := range c.Regressions {
		lines[i] = "  " + r.String()
	}
	return fmt.Errorf("bench: %d regression(s) beyond tolerance %.0f%%:\n%s", len(c.Regressions), 100*c.Tolerance, strings.Join(lines, "\n"))
}

// Check compares the ratios of current with those of baseline, never
// absolute times. A measured cell regresses when its ratio is below
// (1-tol) times the baseline's, where tol is the larger of tolerance and
// the baseline record's own Tolerance; a measured baseline cell the current
// run lacks (or did not measure) is reported missing. tolerance <= 0 means
// DefaultTolerance.
func Check(baseline, current []Record, tolerance float64) CheckResult {
	if tolerance <= 0 {
		tolerance = DefaultTolerance
	}
	res := CheckResult{Tolerance: tolerance}
	cur := map[string]Record{}
	for _, r := range current {
		if r.Measured() {
			cur[r.Key()] = r
		}
	}
	seen := map[string]bool{}
	for _, b := range baseline {
		if !b.Measured() || b.Ratio <= 0 {
			continue
		}
		k := b.Key()
		seen[k] = true
		c, ok := cur[k]
		if !ok {
			res.Regressions = append(res.Regressions, Regression{Key: k, Baseline: b.Ratio, Missing: true})
			continue
		}
		res.Compared++
		tol := max(tolerance, b.Tolerance)
		if c.Ratio < b.Ratio*(1-tol) {
			res.Regressions = append(res.Regressions, Regression{Key: k, Baseline: b.Ratio, Current: c.Ratio, Tolerance: tol})
		}
	}
	for k := range cur {
		if !seen[k] {
			res.New = append(res.New, k)
		}
	}
	sort.Strings(res.New)
	return res
}

// Recheck re-measures each cell of a failed check up to tries more times
// (with cfg's settings, narrowed to that cell), keeps the cell's best
// ratio, and checks again. Noise on a shared machine rarely repeats; a real
// regression does. Missing cells are not re-measured. It returns the
// updated records and the new result.
func Recheck(ctx context.Context, cfg Config, baseline, current []Record, res CheckResult, tries int) ([]Record, CheckResult, error) {
	out := slices.Clone(current)
	index := map[string]int{}
	for i, r := range out {
		if r.Measured() {
			index[r.Key()] = i
		}
	}
	for _, reg := range res.Regressions {
		i, ok := index[reg.Key]
		if reg.Missing || !ok {
			continue
		}
		for try := 0; try < tries && out[i].Ratio < reg.Baseline*(1-reg.Tolerance); try++ {
			c := cellConfig(cfg, out[i])
			again, err := Run(ctx, c)
			if err != nil {
				return out, res, err
			}
			for _, r := range again.Records {
				if r.Measured() && r.Key() == reg.Key && r.Ratio > out[i].Ratio {
					r.Note = strings.TrimSpace(r.Note + fmt.Sprintf(" best of %d runs", try+2))
					out[i] = r
				}
			}
		}
	}
	return out, Check(baseline, out, res.Tolerance), nil
}

// cellConfig narrows cfg to the one cell r was measured in.
func cellConfig(cfg Config, r Record) Config {
	c := cfg
	c.Progress = nil
	c.Paths, c.Push = []string{r.Path}, []string{}
	if r.Mode == ModePush {
		c.Paths, c.Push = []string{}, []string{r.Path}
	}
	if r.Kind == KindLatency {
		c.Sizes, c.Concurrency = []int64{}, []int{}
		c.LatencySizes, c.NoLatency = []int64{r.Size}, false
		return c
	}
	c.Sizes, c.Concurrency, c.NoLatency = []int64{r.Size}, []int{r.Concurrency}, true
	return c
}

// Median merges several runs of the same matrix into one: for each cell,
// the record whose ratio is the median across the runs (the lower middle
// for an even count). Baselines written this way are not one run's luck.
// With three runs or more, a cell whose runs spread widely gets its own
// Tolerance: twice the lowest run's shortfall from the median, capped at
// MaxCellTolerance, when that exceeds DefaultTolerance; the guard then
// tolerates what the cell was seen to do on this machine class.
// Cells missing from some runs take the median of the runs that have them;
// records that are not measured come from the first run.
func Median(runs ...[]Record) []Record {
	if len(runs) == 0 {
		return nil
	}
	byKey := map[string][]Record{}
	for _, run := range runs {
		for _, r := range run {
			if r.Measured() {
				byKey[r.Key()] = append(byKey[r.Key()], r)
			}
		}
	}
	var out []Record
	for _, r := range runs[0] {
		if !r.Measured() {
			out = append(out, r)
			continue
		}
		c := byKey[r.Key()]
		sort.SliceStable(c, func(i, j int) bool { return c[i].Ratio < c[j].Ratio })
		m := c[(len(c)-1)/2]
		if len(runs) > 1 {
			m.Note = strings.TrimSpace(m.Note + fmt.Sprintf(" median of %d runs", len(c)))
		}
		if len(c) >= 3 && m.Ratio > 0 {
			if tol := min(MaxCellTolerance, 2*(1-c[0].Ratio/m.Ratio)); tol > DefaultTolerance {
				m.Tolerance = math.Round(tol*100) / 100
				m.Note += fmt.Sprintf("; runs spread %.2f-%.2f", c[0].Ratio, c[len(c)-1].Ratio)
			}
		}
		if floor, why := NoiseFloor(m); floor > m.Tolerance && len(runs) > 1 {
			m.Tolerance = floor
			m.Note += "; " + why
		}
		out = append(out, m)
	}
	return out
}
