package main

import (
	"fmt"
	"strings"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tensorlane/tensorlane/cmd/internal/worker"
	"github.com/tensorlane/tensorlane/rdt/schema"
	"github.com/tensorlane/tensorlane/topology"
)

func init() { rootCmd.AddCommand(newWorkerCmd()) }

// newWorkerCmd builds the command; tests build fresh ones. Its flags are
// the configuration schema's worker fields (rdt/schema), made from
// worker.Config by schema.BindFlags: the same names as rdt.Config and the
// C ABI's JSON, the schema's docs as help, old names as deprecated aliases.
func newWorkerCmd() *cobra.Command {
	var o worker.Config
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run one runtime claiming a topology host, driven by JSON lines on stdin",
		Long: `worker starts one tensorlane runtime that claims a host of a topology preset and
serves a line-based JSON protocol on stdin/stdout (put, get, free, info, connect, exit),
so that a test harness can run several runtimes as separate processes, for example one
per network namespace, and inject faults (kill -9, link down, netem) from outside.
Devices are simulated arenas unless --device-backend says otherwise; keep
--device-memory small. Logs go to stderr. The flags are the configuration fields
of docs/config.md.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := workerConfig(cmd.Flags(), o)
			if err != nil {
				return err
			}
			return worker.Run(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), cfg)
		},
	}
	if err := schema.BindFlags(cmd.Flags(), &o, schema.Worker, map[string]string{"verbose": "v"}); err != nil {
		panic(err) // worker.Config and the schema disagree: a test catches it first
	}
	cmd.SetFlagErrorFunc(suggestFlag)
	return cmd
}

// suggestFlag adds the schema's nearest field to an unknown flag's error,
// as the C ABI and Python do for an unknown key.
func suggestFlag(_ *cobra.Command, err error) error {
	name, ok := strings.CutPrefix(err.Error(), "unknown flag: --")
	if !ok {
		return err
	}
	if s := schema.Suggest(name, schema.Worker); s != "" {
		f, _ := schema.Lookup(s)
		return fmt.Errorf("%w (did you mean --%s?)", err, f.Flag())
	}
	return err
}

// workerConfig refuses what worker.Config would silently read as its
// defaults: a zero given explicitly.
func workerConfig(fs *pflag.FlagSet, cfg worker.Config) (worker.Config, error) {
	preset, hosts := cfg.Preset, cfg.Hosts
	if !fs.Changed("preset") {
		preset = "dgx-h100"
	}
	if !fs.Changed("hosts") {
		hosts = 3
	}
	if preset == "" || hosts < 1 {
		_, err := topology.Preset(preset, hosts)
		return cfg, err
	}
	// Whole 8-byte words, so the verification patterns cover every byte.
	cfg.DeviceMemory = cfg.DeviceMemory / 8 * 8
	if fs.Changed("device-memory") && cfg.DeviceMemory <= 0 {
		return cfg, fmt.Errorf("bad size %q: less than one 8-byte word", fs.Lookup("device-memory").Value)
	}
	return cfg, nil
}
