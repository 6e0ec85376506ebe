package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/cmd/internal/envinfo"
)

type envOptions struct {
	json  bool
	root  string
	check bool
	repo  string
}

func init() { rootCmd.AddCommand(newEnvCmd()) }

// newEnvCmd builds the command; tests build fresh ones.
func newEnvCmd() *cobra.Command {
	o := envOptions{}
	cmd := &cobra.Command{
		Use:   "env",
		Short: "Print a manifest of exact versions (kernel, OS, Go, tensorlane, drivers, libraries, firmware)",
		Long: `env prints what a bug report or a reproducible environment needs: kernel, distribution,
Go, tensorlane, CPU, accelerators found, and whatever is installed of the NVIDIA driver and CUDA,
ROCm, the Neuron and Gaudi drivers, libibverbs, libfabric and NIC firmware, and the Python
environment of the tests (Python, Ray, numpy, torch, ml_dtypes and every other package, from
.venv, $VIRTUAL_ENV or $TENSORLANE_PYTHON_ENV). Everything is read from files (no tool is run);
what is absent is left out. --json for machines; --check compares with the locks.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.root != "" {
				// A mistyped root would read nothing and report an empty
				// machine as if it were true.
				st, err := os.Stat(o.root)
				if err != nil {
					return fmt.Errorf("env: --root: %w", err)
				}
				if !st.IsDir() {
					return fmt.Errorf("env: --root %s is not a directory", o.root)
				}
			}
			m := envinfo.Collect(cmd.Context(), o.root)
			if o.root == "" {
				m.Python = envinfo.ReadPython(envinfo.PythonPrefix(o.repo))
			}
			if o.check {
				return runEnvCheck(cmd, o, m)
			}
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(m)
			}
			envinfo.Write(cmd.OutOrStdout(), m)
			if m.Python == nil && o.root == "" {
				fmt.Fprintln(cmd.OutOrStdout(), "python:                no environment found (.venv under --repo, $VIRTUAL_ENV or $TENSORLANE_PYTHON_ENV)")
			}
			return nil
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON")
	cmd.Flags().StringVar(&o.root, "root", "", "read a copied system tree instead of / (as topo --sysfs-root)")
	cmd.Flags().BoolVar(&o.check, "check", false, "say where this machine differs from the locks (go.mod, python/requirements-test.txt); exit non-zero if a pinned version is missing or another")
	cmd.Flags().StringVar(&o.repo, "repo", ".", "the repository whose locks --check reads, and whose .venv is the Python environment")
	return cmd
}

// runEnvCheck prints where m differs from the repository's locks and
// fails (envinfo.ErrDiffers) when a pinned version is missing or another.
func runEnvCheck(cmd *cobra.Command, o envOptions, m envinfo.Manifest) error {
	lock, err := envinfo.ReadLock(o.repo)
	if err != nil {
		return err
	}
	diffs := envinfo.Check(m, lock)
	if o.json {
		enc := json.NewEncoder(cmd.OutOrStdout())
		enc.SetIndent("", "  ")
		if err := enc.Encode(struct {
			Differences []envinfo.Difference `json:"differences"`
		}{diffs}); err != nil {
			return err
		}
	}
	fatal := 0
	for _, d := range diffs {
		if d.Fatal {
			fatal++
		}
		if !o.json {
			fmt.Fprintln(cmd.OutOrStdout(), "env:", d)
		}
	}
	if fatal > 0 {
		return fmt.Errorf("%w: %d pinned version(s) missing or different (scripts/deps.sh installs the locks)", envinfo.ErrDiffers, fatal)
	}
	if !o.json {
		fmt.Fprintf(cmd.OutOrStdout(), "env: go %s and %d Python packages as locked (%s)\n", lock.Go, len(lock.Packages), lock.PyFile)
	}
	return nil
}
