package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/internal/envinfo"
)

type envOptions struct {
	json bool
	root string
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
ROCm, the Neuron and Gaudi drivers, libibverbs and NIC firmware. Everything is read from files
(no tool is run); what is absent is left out. --json for machines.`,
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
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(m)
			}
			envinfo.Write(cmd.OutOrStdout(), m)
			return nil
		},
	}
	cmd.Flags().BoolVar(&o.json, "json", false, "print JSON")
	cmd.Flags().StringVar(&o.root, "root", "", "read a copied system tree instead of / (as topo --sysfs-root)")
	return cmd
}
