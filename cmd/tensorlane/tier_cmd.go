package main

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/bench/tiers"
)

type tierOptions struct {
	tier, results, history, plot string
}

func init() { rootCmd.AddCommand(newTierCmd()) }

// newTierCmd builds "tier record"; tests build fresh ones.
func newTierCmd() *cobra.Command {
	o := tierOptions{}
	cmd := &cobra.Command{
		Use:    "tier-record",
		Short:  "Record a test tier's run (make pr/nightly/release): summary.json, a history line, a plot over time",
		Hidden: false,
		Long: `tier-record reads a tier's results directory (steps.tsv written by scripts/tier-step.sh,
and bench/results.json, ab.json, soak.json, env.json when the tier made them), writes
summary.json there, appends the summary to --history (kept in the repository, testdata/tiers),
and plots every figure over that history into --plot. Exits non-zero when a step failed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rev := ""
			if out, err := exec.CommandContext(cmd.Context(), "git", "rev-parse", "HEAD").Output(); err == nil {
				rev = strings.TrimSpace(string(out))
			}
			s, err := tiers.Collect(o.results, o.tier, rev, time.Now())
			if err != nil {
				return err
			}
			b, err := json.MarshalIndent(s, "", "  ")
			if err != nil {
				return err
			}
			if err := os.WriteFile(filepath.Join(o.results, "summary.json"), append(b, '\n'), 0o644); err != nil {
				return err
			}
			if err := tiers.Append(o.history, s); err != nil {
				return err
			}
			hist, err := tiers.ReadHistory(o.history)
			if err != nil {
				return err
			}
			if err := tiers.Plot(o.plot, o.tier, hist); err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			for _, st := range s.Steps {
				fmt.Fprintf(out, "%-28s %-24s %7.0f s\n", st.Name, st.Status, st.Seconds)
			}
			fmt.Fprintf(out, "%s: %s; %d figures; summary %s, history %s (%d runs), plot %s\n", o.tier,
				map[bool]string{true: "PASS", false: "FAIL"}[s.Pass], len(s.Figures), filepath.Join(o.results, "summary.json"), o.history, len(hist), o.plot)
			if !s.Pass {
				return fmt.Errorf("tier %s: a step failed", o.tier)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.tier, "tier", "pr", "the tier's name")
	f.StringVar(&o.results, "results", "", "the tier's results directory")
	f.StringVar(&o.history, "history", "", "the history file (default testdata/tiers/<tier>.jsonl)")
	f.StringVar(&o.plot, "plot", "", "the plot (default <results>/history.png)")
	cmd.PreRunE = func(*cobra.Command, []string) error {
		if o.results == "" {
			return fmt.Errorf("tier-record: --results is required")
		}
		if o.history == "" {
			o.history = filepath.Join("testdata", "tiers", o.tier+".jsonl")
		}
		if o.plot == "" {
			o.plot = filepath.Join(o.results, "history.png")
		}
		return nil
	}
	return cmd
}
