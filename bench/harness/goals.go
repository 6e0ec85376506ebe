package harness

import "fmt"

// Goal is a ratio the fabric issue sets for a path: at MinSize and above,
// one transfer in flight (where the path is bandwidth-bound), its ratio
// against Baseline must reach Min.
type Goal struct {
	Path, Mode, Baseline string
	MinSize              int64
	Min                  float64
}

// Goals are the fabric issue's throughput goals this harness measures.
// Cross-process push shares pull's goal: it is the same copy through the
// same shared memory, the other way. The goals it does not measure (two
// rails against one on shaped links, compression on a slow link) have
// tests of their own, listed in docs/benchmarks.md.
var Goals = []Goal{
	{PathP2PIPC, ModePull, BaseMemcpy, 64 << 20, 0.7},
	{PathSHM, ModePull, BaseMemcpy, 64 << 20, 0.7},
	{PathP2PIPC, ModePush, BaseMemcpy, 64 << 20, 0.7},
	{PathSHM, ModePush, BaseMemcpy, 64 << 20, 0.7},
	{PathTCP, ModePull, BaseRawTCP, 64 << 20, 0.9},
	// The wire issue's: ahead of UCX on the same host, where it is
	// installed, like with like: one Get in flight against one UCX message
	// in flight (the -o1 rows; the plain UCX rows keep up to 32 in flight
	// and are compared with cells of as many Gets, outside the goals).
	{PathTCP, ModePull, BaseUCXTCP1, 64 << 20, 1.2},
	{PathSHM, ModePull, BaseUCXSM1, 64 << 20, 1.5},
}

// GoalResult is one measured cell judged against its goal.
type GoalResult struct {
	Goal
	Size  int64
	Ratio float64
	Met   bool
}

func (g GoalResult) String() string {
	verdict := "met"
	if !g.Met {
		verdict = "below the goal" // a target, not the regression check
	}
	return fmt.Sprintf("%s %s %s vs %s: %.2f (goal >= %.2f) %s", g.Path, g.Mode, SizeString(g.Size), g.Baseline, g.Ratio, g.Min, verdict)
}

// CheckGoals judges every measured cell a goal covers, in goal order.
func CheckGoals(recs []Record) []GoalResult {
	var out []GoalResult
	for _, g := range Goals {
		for _, r := range recs {
			if r.Kind == KindThroughput && r.Measured() && r.Path == g.Path && r.Mode == g.Mode &&
				r.Baseline == g.Baseline && r.Concurrency == 1 && r.Size >= g.MinSize {
				out = append(out, GoalResult{Goal: g, Size: r.Size, Ratio: r.Ratio, Met: r.Ratio >= g.Min})
			}
		}
	}
	return out
}
