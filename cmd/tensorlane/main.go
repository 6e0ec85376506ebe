// Command tensorlane is the command-line shell over the tensorlane library:
// the demo, topology and environment reports, benchmarks, placement and
// conformance. Each subcommand lives in its own file and registers itself
// on rootCmd in an init function.
package main

import (
	"fmt"
	"os"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/bench/devbench"
)

var rootCmd = &cobra.Command{
	Use:           "tensorlane",
	Short:         "Direct tensor transport between actors on accelerator clusters",
	SilenceUsage:  true,
	SilenceErrors: true,
}

func main() {
	if code, ok := devbench.Owner(); ok {
		os.Exit(code) // this process is the owner of a device bench row
	}
	if err := rootCmd.Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "tensorlane:", err)
		os.Exit(1)
	}
}
