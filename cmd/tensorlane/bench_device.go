package main

import (
	"encoding/json"
	"fmt"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/bench/devbench"
	"github.com/tensorlane/tensorlane/bench/harness"
)

// pathDevice selects the device rows (bench/devbench): CUDA device memory
// on the GPU the driver gives (TENSORLANE_LIBCUDA names another driver,
// the fake one in CI, whose rows say mode fake-driver).
const pathDevice = "device"

func runDeviceBench(cmd *cobra.Command, o benchOptions) error {
	out := cmd.OutOrStdout()
	cfg := devbench.Config{Rounds: o.minRounds}
	for _, s := range o.sizes {
		n, err := parseSize(s)
		if err != nil {
			return err
		}
		cfg.Sizes = append(cfg.Sizes, n)
	}
	rows, err := devbench.Run(cmd.Context(), cfg)
	if err != nil {
		return fmt.Errorf("device rows: %w", err)
	}
	recs := make([]harness.Record, len(rows))
	for i, r := range rows {
		recs[i] = harness.Record{Kind: harness.KindThroughput, Path: r.Path, Mode: r.Mode, Size: r.Size, Concurrency: 1,
			GBps: r.GBps, MedianGBps: r.GBps, Baseline: r.Baseline, BaselineGBps: r.BaselineGBps, Ratio: r.Ratio,
			Rounds: r.Rounds, Note: r.Note}
		if r.Skipped != "" {
			recs[i].Status, recs[i].Note = harness.StatusSkipped, r.Skipped
		}
	}
	if o.json {
		for _, r := range recs {
			if err := json.NewEncoder(out).Encode(r); err != nil {
				return err
			}
		}
		return nil
	}
	fmt.Fprintln(out, "device paths (CUDA device memory; each row interleaved with its baseline, one in flight):")
	if err := harness.WriteTable(out, recs); err != nil {
		return err
	}
	for _, r := range rows {
		if g, ok := r.Goal(); ok {
			verdict := "met"
			if r.Ratio < g {
				verdict = "below the goal"
			}
			fmt.Fprintf(out, "  goal: %s %s vs %s: %.2f (goal >= %.2f) %s\n", r.Path, harness.SizeString(r.Size), r.Baseline, r.Ratio, g, verdict)
		}
	}
	for _, r := range rows {
		if r.Skipped == "" && r.Mode == devbench.ModeFake {
			fmt.Fprintf(out, "  %s\n", r.Note)
			break
		}
	}
	return nil
}
