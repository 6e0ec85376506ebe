package harness_test

import (
	"fmt"

	"github.com/tensorlane/tensorlane/bench/harness"
)

// Check compares ratios, never absolute rates: a cell fails when its ratio
// falls more than its tolerance (the larger of the flag's and the cell's
// own) below the stored one.
func ExampleCheck() {
	stored := []harness.Record{
		{Kind: harness.KindThroughput, Path: harness.PathSHM, Mode: harness.ModePull, Size: 64 << 20, Concurrency: 1, Baseline: harness.BaseMemcpy, Ratio: 0.95},
		{Kind: harness.KindThroughput, Path: harness.PathRDMA, Mode: harness.ModePush, Size: 1 << 20, Concurrency: 8, Baseline: harness.BaseRawTCP, Ratio: 0.30, Tolerance: 0.45},
	}
	now := []harness.Record{
		{Kind: harness.KindThroughput, Path: harness.PathSHM, Mode: harness.ModePull, Size: 64 << 20, Concurrency: 1, Baseline: harness.BaseMemcpy, Ratio: 0.60},
		{Kind: harness.KindThroughput, Path: harness.PathRDMA, Mode: harness.ModePush, Size: 1 << 20, Concurrency: 8, Baseline: harness.BaseRawTCP, Ratio: 0.20},
	}
	res := harness.Check(stored, now, harness.DefaultTolerance)
	fmt.Println(res.Compared, "compared")
	for _, r := range res.Regressions {
		fmt.Println(r)
	}
	// Output:
	// 2 compared
	// throughput/shm/pull/64MiB/c1/vs-memcpy: ratio 0.6, baseline 0.95 (-37%, tolerance 25%)
}
