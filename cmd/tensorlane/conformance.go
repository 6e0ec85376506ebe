package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/conformance"

	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/topocheck"
)

type conformanceOptions struct {
	json     bool
	hardware bool
	plugin   string
	verbose  bool
	trees    string
	run      bool
	points   []string
	timeout  time.Duration
	repo     string
}

func init() { rootCmd.AddCommand(newConformanceCmd()) }

// newConformanceCmd builds the command; tests build fresh ones.
func newConformanceCmd() *cobra.Command {
	o := conformanceOptions{}
	cmd := &cobra.Command{
		Use:   "conformance",
		Short: "Print the maturity level of every plug-in point (device plugins, device back-ends, transports, rdma providers, the Ray plug-in)",
		Long: `conformance prints, for every plug-in point, the level it declares and the level its checks
verified (experimental, alpha, beta, stable), from one definition of what each level demands
(package conformance; docs/ci.md lists it).

Device plugins: the topology suite (package topology/topocheck) runs in process on every plugin
(built-in and registered) against the built-in fixture trees; its stable checks discover this
machine and need --hardware, which says that it has the plugin's devices.

Device back-ends, transports, rdma providers and the Ray plug-in: their checks are go test and
pytest runs in a checkout (--repo); --run runs them, lowest level first (minutes: they run under
-race), and a check whose needs are missing here (root, libfabric, a GPU) leaves its level
unverified rather than failed. Without --run their declared levels and checks are listed.

Exits non-zero when a device plugin verifies below its declared level, or a check at or below
another point's declared level fails (one that could not run here is reported, not failed).`,
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
	f.StringSliceVar(&o.points, "point", nil, "only these plug-in points (names, e.g. shm,ofi); device plugins are then left out")
	f.BoolVar(&o.run, "run", false, "run the checks of the device back-ends, transports, rdma providers and the Ray plug-in (needs a checkout)")
	f.DurationVar(&o.timeout, "timeout", 20*time.Minute, "with --run: the bound of one check")
	f.StringVar(&o.repo, "repo", ".", "with --run: the checkout the checks run in")
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
	cache := topocheck.NewTreeCache(tmp)
	if o.trees != "" {
		for _, f := range topocheck.Fixtures() {
			d := filepath.Join(o.trees, f.Name)
			if fi, err := os.Stat(d); err == nil && fi.IsDir() {
				cache.Seed(f.Name, d)
			}
		}
	}
	var reports []topocheck.Report
	for _, p := range topology.DefaultPlugins() {
		if o.plugin != "" && p.Name() != o.plugin || len(o.points) > 0 {
			continue
		}
		reports = append(reports, topocheck.Check(ctx, p, topocheck.Config{Hardware: o.hardware, Cache: cache}))
	}
	if len(reports) == 0 && len(o.points) == 0 {
		return fmt.Errorf("conformance: no plugin %q", o.plugin)
	}
	var low []string
	for _, r := range reports {
		if !r.OK() {
			low = append(low, r.Plugin)
		}
	}
	// The other plug-in points, when no single device plugin was asked for.
	var points []conformance.Report
	if o.plugin == "" {
		for _, p := range conformance.Points() {
			if len(o.points) > 0 && !slices.Contains(o.points, p.Name) {
				continue
			}
			r := conformance.Verify(ctx, p, o.repo, o.run, o.timeout)
			if !r.OK() {
				low = append(low, string(r.Kind)+" "+r.Name)
			}
			points = append(points, r)
		}
	}
	if o.json {
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		var v any = reports // --plugin: the device plugin's report alone, as before
		if o.plugin == "" {
			v = struct {
				DevicePlugins []topocheck.Report   `json:"device_plugins"`
				Points        []conformance.Report `json:"points"`
				Levels        map[string]string    `json:"levels"`
			}{reports, points, levelDemands()}
		}
		if err := enc.Encode(v); err != nil {
			return err
		}
	} else {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		if len(reports) > 0 {
			fmt.Fprintln(tw, "PLUGIN\tDECLARED\tVERIFIED\tCHECKS\tNOTES")
		}
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
		if len(points) > 0 {
			writePoints(w, points, o.verbose)
		}
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

// writePoints prints the other plug-in points as a table, and with
// verbose every check.
func writePoints(w io.Writer, points []conformance.Report, verbose bool) {
	fmt.Fprintln(w)
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "KIND\tNAME\tDECLARED\tVERIFIED\tCHECKS\tNOTES")
	for _, r := range points {
		passed, note := 0, ""
		for _, c := range r.Results {
			if c.State == "pass" {
				passed++
			} else if note == "" && r.Ran {
				note = c.Level.String() + " " + c.Name + ": " + c.State
			}
		}
		verified := levelName(r.Verified)
		if !r.Ran {
			verified, note = "(not run)", "--run runs its checks"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d/%d\t%s\n", r.Kind, r.Name, r.Declared, verified, passed, len(r.Results), note)
	}
	tw.Flush()
	if verbose {
		for _, r := range points {
			fmt.Fprintf(w, "\n%s %s:\n", r.Kind, r.Name)
			for _, c := range r.Results {
				fmt.Fprintf(w, "  %-13s %-22s %s\n", c.Level, c.Name, c.State)
			}
		}
		fmt.Fprintln(w, "\nlevels (package conformance):")
		for l := conformance.Experimental; l <= conformance.Stable; l++ {
			fmt.Fprintf(w, "  %-13s %s\n", l, conformance.Demands[l])
		}
	}
}

func levelDemands() map[string]string {
	out := map[string]string{}
	for l, d := range conformance.Demands {
		out[l.String()] = d
	}
	return out
}

func levelName(m topology.Maturity) string {
	if m < 0 {
		return "none"
	}
	return m.String()
}
