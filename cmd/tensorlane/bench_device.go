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
	recs, err := devbench.Run(cmd.Context(), cfg)
	if err != nil {
		return fmt.Errorf("device rows: %w", err)
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
	for _, g := range devbench.CheckGoals(recs) {
		fmt.Fprintf(out, "  %s\n", g)
	}
	for _, r := range recs {
		if r.Measured() && r.Mode == devbench.ModeFake {
			fmt.Fprintf(out, "  %s: %s\n", r.Path, r.Note)
			break
		}
	}
	return nil
}
