package main

import (
	"github.com/spf13/cobra"

	"github.com/tensorlane/tensorlane/cmd/internal/worker"
	"github.com/tensorlane/tensorlane/topology"
)

// workerFlags are the flags worker.Config does not take as they are: sizes
// arrive as text ("1GiB").
type workerFlags struct {
	worker.Config
	deviceMemory string
	hostMemory   string
}

func init() { rootCmd.AddCommand(newWorkerCmd()) }

// newWorkerCmd builds the command; tests build fresh ones.
func newWorkerCmd() *cobra.Command {
	o := workerFlags{}
	cmd := &cobra.Command{
		Use:   "worker",
		Short: "Run one runtime claiming a topology host, driven by JSON lines on stdin",
		Long: `worker starts one tensorlane runtime that claims a host of a topology preset and
serves a line-based JSON protocol on stdin/stdout (put, get, free, info, connect, exit),
so that a test harness can run several runtimes as separate processes, for example one
per network namespace, and inject faults (kill -9, link down, netem) from outside.
Devices are simulated arenas; keep --device-memory small. Logs go to stderr.`,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := o.config()
			if err != nil {
				return err
			}
			return worker.Run(cmd.Context(), cmd.InOrStdin(), cmd.OutOrStdout(), cmd.ErrOrStderr(), cfg)
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.Preset, "preset", "dgx-h100", "topology preset")
	f.IntVar(&o.Hosts, "hosts", 3, "number of hosts in the preset cluster")
	f.StringVar(&o.Host, "host", "h0", "topology host this worker claims")
	f.StringVar(&o.deviceMemory, "device-memory", "1GiB", "capacity of each simulated device arena")
	f.StringVar(&o.hostMemory, "host-memory", "", "cap on host memory allocations (default unbounded)")
	f.StringSliceVar(&o.Listen, "listen", nil, "libp2p control multiaddrs (default /ip4/127.0.0.1/tcp/0)")
	f.StringVar(&o.DataAddr, "data-addr", "", "tcp data listener address (default 127.0.0.1:0)")
	f.StringVar(&o.IdentityFile, "identity-file", "", "libp2p key file; created if missing, so a restarted worker keeps its peer id")
	f.StringSliceVar(&o.Transports, "transports", nil, "allowed transports (default all)")
	f.DurationVar(&o.StallTimeout, "stall-timeout", 0, "fail a transfer with no progress for this long (default the runtime's, 30s)")
	f.DurationVar(&o.TransferTimeout, "transfer-timeout", 0, "bound on a get without timeout_ms (default the runtime's, 2m)")
	f.DurationVar(&o.Heartbeat, "heartbeat-interval", 0, "ping watched peers this often (default the runtime's, 1s)")
	f.IntVar(&o.HeartbeatMisses, "heartbeat-misses", 0, "declare a peer dead after this many missed pings (default 3)")
	f.DurationVar(&o.LeaseRenew, "lease-renew", 0, "readers renew leases this often (default the runtime's, 5s)")
	f.StringVar(&o.ClusterKeyFile, "cluster-key-file", "", "file holding the 32-byte cluster key (raw or hex); only members connect")
	f.StringSliceVar(&o.AllowPeers, "allow-peers", nil, "admit only these peer ids")
	f.BoolVar(&o.Encrypt, "encrypt", false, "encrypt data connections")
	f.StringVar(&o.RDMAIP, "rdma-ip", "", "address the simulated RDMA NICs' rails listen on (default loopback; set it to the host's address in a network namespace)")
	f.BoolVar(&o.NoRDMA, "no-rdma", false, "turn the rdma path off")
	f.BoolVarP(&o.Verbose, "verbose", "v", false, "debug logs on stderr")
	return cmd
}

// config turns the flags into the worker's Config.
func (o workerFlags) config() (worker.Config, error) {
	cfg := o.Config
	if cfg.Preset == "" || cfg.Hosts < 1 { // worker.Config would read these as its defaults: refuse them as the preset does
		_, err := topology.Preset(cfg.Preset, cfg.Hosts)
		return cfg, err
	}
	var err error
	if cfg.DeviceMemory, err = parseWordSize(o.deviceMemory); err != nil {
		return cfg, err
	}
	if o.hostMemory != "" {
		if cfg.HostMemory, err = parseSize(o.hostMemory); err != nil {
			return cfg, err
		}
	}
	return cfg, nil
}
