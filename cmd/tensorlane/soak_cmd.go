package main

import (
	"encoding/json"
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/cmd/internal/soak"
)

// soakFlags are soak.Config plus what only the command has: the size as
// text and the output format.
type soakFlags struct {
	soak.Config
	maxSize string
	json    bool
}

func init() { rootCmd.AddCommand(newSoakCmd()) }

// newSoakCmd builds the command; tests build fresh ones.
func newSoakCmd() *cobra.Command {
	o := soakFlags{}
	cmd := &cobra.Command{
		Use:   "soak",
		Short: "Random verified transfers between runtimes while injecting faults",
		Long: `soak runs several runtimes in this process (simulated dgx-h100 hosts talking over
loopback) and moves random tensors between them for --duration (one in eight a broadcast
to slots two to four readers reserved), checking every byte,
while a fault injector kills and restarts runtimes (same identity and addresses, so old
refs meet a new incarnation), cuts data connections, blackholes and delays them (through
TCP proxies the readers are routed over) and presents forged refs.

It prints transfers, faults_injected, errors_surfaced, hung, bytes_corrupted and
leaked_bytes (plus details). A call is hung when it did not return within its bound
(--bound plus a grace period); leaked_bytes is device memory still in use at the end,
after every object was freed. Exits non-zero if hung, bytes_corrupted, leaked_bytes,
untyped_errors or forged_accepted is not zero.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.config()
			if err != nil {
				return err
			}
			res, err := soak.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			if o.json {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				if err := enc.Encode(res); err != nil {
					return err
				}
			} else {
				soak.Print(cmd.OutOrStdout(), res)
			}
			if !res.OK {
				return fmt.Errorf("soak failed: hung %d, bytes_corrupted %d, leaked_bytes %d, untyped_errors %d, forged_accepted %d",
					res.Hung, res.BytesCorrupted, res.LeakedBytes, res.UntypedErrors, res.ForgedAccepted)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.DurationVar(&o.Duration, "duration", time.Minute, "how long to run")
	f.IntVar(&o.Runtimes, "runtimes", 3, "runtimes (simulated hosts) in the soak")
	f.IntVar(&o.Concurrency, "concurrency", 4, "transfers in flight at once")
	f.StringVar(&o.maxSize, "max-size", "8MiB", "largest tensor moved")
	f.DurationVar(&o.FaultEvery, "fault-every", 300*time.Millisecond, "mean interval between injected faults")
	f.DurationVar(&o.Bound, "bound", 10*time.Second, "deadline of every transfer; a call still running after bound+grace counts as hung")
	f.DurationVar(&o.Stall, "stall-timeout", 2*time.Second, "runtimes' stall detector")
	f.Uint64Var(&o.Seed, "seed", 0, "random seed (0: from the clock; printed in the result)")
	f.BoolVar(&o.json, "json", false, "print the result as JSON")
	f.BoolVarP(&o.Verbose, "verbose", "v", false, "log runtime events to stderr")
	return cmd
}

// config turns the flags into soak.Config. A flag set to zero is refused
// rather than read as soak.Config's default.
func (o soakFlags) config() (soak.Config, error) {
	cfg := o.Config
	if cfg.Runtimes < 2 || cfg.Concurrency < 1 || cfg.Duration <= 0 || cfg.Bound <= 0 || cfg.FaultEvery <= 0 {
		return cfg, fmt.Errorf("soak: need --runtimes >= 2, --concurrency >= 1 and positive --duration, --bound, --fault-every")
	}
	var err error
	cfg.MaxSize, err = parseWordSize(o.maxSize)
	return cfg, err
}
