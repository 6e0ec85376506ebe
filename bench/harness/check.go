package harness

import (
	"fmt"
	"sort"
	"strings"
)

// DefaultTolerance is the fraction a ratio may fall below the stored
// baseline's ratio before Check calls it a regression.
const DefaultTolerance = 0.25

// Regression is one cell whose ratio fell too far, or that the current run
// no longer measures.
type Regression struct {
	Key      string
	Baseline float64 // the stored ratio
	Current  float64 // the measured ratio; 0 when Missing
	Missing  bool
}

func (r Regression) String() string {
	if r.Missing {
		return fmt.Sprintf("%s: in the baseline (ratio %.3g) but not measured in this run", r.Key, r.Baseline)
	}
	return fmt.Sprintf("%s: ratio %.3g, baseline %.3g (%+.0f%%)", r.Key, r.Current, r.Baseline, 100*(r.Current/r.Baseline-1))
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
// (1-tolerance) times the baseline's; a measured baseline cell the current
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
		if c.Ratio < b.Ratio*(1-tolerance) {
			res.Regressions = append(res.Regressions, Regression{Key: k, Baseline: b.Ratio, Current: c.Ratio})
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
