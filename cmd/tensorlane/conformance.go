package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/topotest"
)

type conformanceOptions struct {
	json     bool
	hardware bool
	plugin   string
	verbose  bool
	trees    string
}

func init() { rootCmd.AddCommand(newConformanceCmd()) }

// newConformanceCmd builds the command; tests build fresh ones.
func newConformanceCmd() *cobra.Command {
	o := conformanceOptions{}
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Run the device-plugin conformance suite and print each plugin's maturity level",
		Long: `conformance runs the topology device-plugin suite (package topology/topotest) on every
plugin (built-in and registered) against the built-in fixture trees, and prints the level each
declares and the level the suite verified (experimental, alpha, beta, stable). The stable checks
discover this machine and need --hardware, which says that it has the plugin's devices.
Exits non-zero when a plugin verifies below its declared level.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return runConformance(cmd.Context(), cmd.OutOrStdout(), o)
		},
	}
	f := cmd.Flags()
	f.BoolVar(&o.json, "json", false, "print the reports as JSON")
	f.BoolVar(&o.hardware, "hardware", false, "this machine has the plugins' devices: run the stable (hardware) checks")
	f.StringVar(&o.plugin, "plugin", "", "run only this plugin")
	f.BoolVarP(&o.verbose, "verbose", "v", false, "list every check")
	f.StringVar(&o.trees, "trees", "", "read the fixture trees from DIR/<name> (e.g. topology/testdata/sysfs) instead of building them")
	return cmd
}

// errConformance is returned when a plugin verifies below its declared level.
type errConformance struct{ plugins []string }

func (e errConformance) Error() string {
	return fmt.Sprintf("conformance: %v below their declared level", e.plugins)
}

func runConformance(ctx context.Context, w io.Writer, o conformanceOptions) error {
	if ctx == nil {
		ctx = context.Background()
	}
	tmp, err := os.MkdirTemp("", "tensorlane-conformance-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(tmp)
	cache := topotest.NewTreeCache(tmp)
	if o.trees != "" {
		for _, f := range topotest.Fixtures() {
			d := filepath.Join(o.trees, f.Name)
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				cache.Seed(f.Name, d)
			}
		}
	}
	var reports []topotest.Report
	for _, p := range topology.DefaultPlugins() {
		if o.plugin != "" && p.Name() != o.plugin {
			continue
		}
		reports = append(reports, topotest.Check(ctx, p, topotest.Config{Hardware: o.hardware, Cache: cache}))
	}
	if len(reports) == 0 {
		return fmt.Errorf("conformance: no plugin %q", o.plugin)
	}
	var low []string
	for _, r := range reports {
		if !r.OK() {
			low = append(low, r.Plugin)
		}
	}
	if o.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		if err := enc.Encode(reports); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "PLUGIN\tDECLARED\tVERIFIED\tCHECKS\tNOTES")
		for _, r := range reports {
			passed := 0
			note := ""
			for _, c := range r.Results {
				if c.Passed {
					passed++
				} else if note == "" && !c.Skipped {
					note = c.Name + ": " + c.Msg
				}
			}
			switch {
			case note == "" && !r.OK():
				note = "below the declared level"
			case note == "" && r.Verified < topology.Stable:
				note = "stable needs a run on hardware (--hardware)"
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%d/%d\t%s\n", r.Plugin, r.Declared, levelName(r.Verified), passed, len(r.Results), note)
		}
		tw.Flush()
		if o.verbose {
			for _, r := range reports {
				fmt.Fprintf(w, "\n%s:\n", r.Plugin)
				for _, c := range r.Results {
					state := "pass"
					switch {
					case c.Skipped:
						state = "skip"
					case !c.Passed:
						state = "FAIL"
					}
					fmt.Fprintf(w, "  %-4s %-13s %-14s %s\n", state, c.Level, c.Name, c.Msg)
				}
			}
		}
	}
	if len(low) > 0 {
		return errConformance{plugins: low}
	}
	return nil
}

func levelName(m topology.Maturity) string {
	if m < 0 {
		return "none"
	}
	return m.String()
}
