package rdt

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/rdt/schema"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Config configures a Runtime. The zero value is valid and means: a
// simulated cluster of one dgx-h100 host, this runtime claiming host "h0"
// with its eight simulated 80 GB GPUs (sparse memfd arenas) and host memory,
// a fresh ed25519 identity, the control listener on loopback, the data
// transports as fabric/stack's zero Config sets them up (listeners on
// loopback, every transport allowed except as narrowed by
// TENSORLANE_TRANSPORTS, no link telemetry), a 2-minute
// transfer timeout, 30 s stall timeout, leases renewed every 5 s and expiring
// after 15 s, heartbeats every second with death after 3 misses, no cluster
// key, no allowlist, unencrypted data connections, logs discarded and
// metrics on a private registry.
//
// Every field that is not a live Go object is one field of the
// configuration schema (rdt/schema; docs/config.md), with the same name in
// the C ABI's and Python's JSON (snake_case) and the worker's flags. An
// invalid field fails New with an error that wraps ErrInvalidArgument and a
// *schema.FieldError naming it.
type Config struct {
	// Cluster is the topology the runtime lives in. Default: the dgx-h100
	// preset with one host.
	Cluster *topology.Cluster
	// Host is the topology host this runtime claims. Default: the first.
	Host string
	// Identity is the libp2p identity key. Default: a new ed25519 key.
	Identity crypto.PrivKey
	// ListenAddrs are libp2p multiaddrs for the control channel. Default:
	// /ip4/127.0.0.1/tcp/0.
	ListenAddrs []string
	// Devices replaces the device memories built from the topology. The
	// runtime does not close memories it did not create.
	Devices []tensor.Memory
	// DeviceBackend chooses the memory of the host's devices when Devices
	// is empty (tensor/backend): "" or "auto" (a discovered host's devices
	// on their vendor's driver when it is usable, else simulated; a
	// preset's simulated), "sim", "real", or one back-end for every
	// device ("cuda", "hip"). Empty reads TENSORLANE_DEVICE_BACKEND unless
	// IgnoreEnv.
	DeviceBackend string
	// VisibleDevices are the indices of the host's accelerators this
	// runtime claims, as a scheduler hands them out (CUDA_VISIBLE_DEVICES,
	// a Ray bundle): nil means all of them, an empty non-nil slice none
	// (host memory only). TENSORLANE_DEVICES ("0,2", "none") sets it unless
	// IgnoreEnv; without it, CUDA_VISIBLE_DEVICES (else HIP_VISIBLE_DEVICES,
	// else ROCR_VISIBLE_DEVICES) does when this field is nil. Two live
	// processes claiming one device of a host are refused
	// (ErrDeviceClaimed): see RuntimeDir.
	VisibleDevices []int
	// RuntimeDir holds the device claim locks, one file per (cluster, host,
	// device), flock'ed for the runtime's life. Default:
	// TENSORLANE_RUNTIME_DIR unless IgnoreEnv, else
	// $XDG_RUNTIME_DIR/tensorlane, else <tmp>/tensorlane-<uid> unless another
	// local user holds it, else <user cache>/tensorlane/run. A program
	// that simulates a whole cluster in one process sets
	// ProcessRuntimeDir(); a test sets t.TempDir() (or runs under
	// internal/testhelp.Isolated, which sets TENSORLANE_RUNTIME_DIR).
	RuntimeDir string
	// DeviceMemory caps each simulated device's arena (bytes); 0 uses the
	// device's memory size from the topology.
	DeviceMemory int64
	// HostMemory caps host memory allocations (bytes); 0 = unbounded.
	HostMemory int64
	// AllowTransports and DenyTransports narrow the data transports, by
	// their names in the transport registry (fabric.Names: local, p2p,
	// shm, rdma, tcp); TENSORLANE_TRANSPORTS narrows them further unless
	// IgnoreEnv. Default: every transport.
	AllowTransports, DenyTransports []string
	// DataAddr is the tcp data listener. Default: 127.0.0.1:0.
	DataAddr string
	// DisableRDMA turns the rdma path off (tcp serves other hosts).
	DisableRDMA bool
	// RDMAProvider picks the rdma provider: "soft" (default) or "ofi".
	// Empty reads TENSORLANE_RDMA_PROVIDER unless IgnoreEnv.
	RDMAProvider string
	// Transports are the data transports' finer settings (listener
	// limits, tcp streams and compression, shm directory, per-NIC rdma
	// addresses, a provider object, link telemetry), for programs that
	// tune fabric/stack. The fields above are the same settings as
	// Transports.Allow, Deny, DataAddr, DisableRDMA and RDMAProviderKind:
	// set each in one place (both is an error unless they agree). The
	// zero value means fabric/stack's defaults; see stack.Config.
	Transports stack.Config
	// IgnoreEnv makes the runtime read no environment variable (it sets
	// Transports.IgnoreEnv too).
	IgnoreEnv bool
	// TransferTimeout bounds a Get whose context has no deadline. Default 2 min.
	TransferTimeout time.Duration
	// StallTimeout fails a transfer that makes no progress for this long.
	// Default 30 s.
	StallTimeout time.Duration
	// LeaseRenew is how often a reader renews its leases on refs it holds;
	// default 5 s. LeaseExpiry is how long an owner keeps a lease that was
	// not renewed (a dead reader's); default 3*LeaseRenew.
	LeaseRenew, LeaseExpiry time.Duration
	// HeartbeatInterval is how often a watched peer is pinged on the
	// control channel, and how long one ping may take; default 1 s. A peer
	// that misses HeartbeatMisses pings in a row (default 3) is declared
	// dead; a lost connection that cannot be re-dialled within one interval
	// declares it dead at once.
	HeartbeatInterval time.Duration
	HeartbeatMisses   int
	// Clock drives the lifecycle timers: lease renewal and expiry, the
	// linger of a Get's lease, heartbeats (their period and each ping's
	// bound) and the times of PeerEvents. Default: the wall clock. Tests
	// pass a clockwork.FakeClock to expire a lease or miss heartbeats by
	// advancing it instead of sleeping. Network and transfer timeouts
	// (StallTimeout, TransferTimeout) stay on the wall clock. The
	// transports' timers (rail pauses, link-health marks) run on it too
	// unless Transports.Clock names another.
	Clock clockwork.Clock
	// ClusterKey, when set (32 bytes), makes the runtime a member of a
	// private cluster: the control channel is a libp2p private network
	// with this key, and data connections prove knowledge of it in their
	// handshake, so non-members can open neither.
	ClusterKey []byte
	// AllowPeers, when not empty, admits only these peers (and the
	// runtime itself) on the control channel and on data connections.
	AllowPeers []peer.ID
	// EncryptData encrypts data connections (AES-256-GCM with session keys
	// from an X25519 exchange inside the authenticated handshake). The
	// control channel is always encrypted (Noise). An owner with
	// EncryptData refuses unencrypted readers. RDMA does not encrypt, so
	// EncryptData turns the rdma path off (tcp serves other hosts).
	EncryptData bool
	// InboxSize is each actor's message queue length. Default 1024.
	InboxSize int
	Logger    *slog.Logger
	// Registerer receives the runtime's metrics. Default: a private
	// registry, available from Runtime.Registry.
	Registerer prometheus.Registerer
}

func (c *Config) withDefaults() (Config, error) {
	out := *c
	if out.Cluster == nil {
		cl, err := topology.Preset("dgx-h100", 1)
		if err != nil {
			return out, err
		}
		out.Cluster = cl
	}
	if out.Host == "" {
		if len(out.Cluster.Hosts) == 0 {
			return out, fmt.Errorf("rdt: cluster %q has no hosts", out.Cluster.Name)
		}
		out.Host = out.Cluster.Hosts[0].ID
	}
	if _, ok := out.Cluster.Host(out.Host); !ok {
		return out, badField("host", "host %q is not in cluster %q (hosts %v)", out.Host, out.Cluster.Name, out.Cluster.HostIDs())
	}
	if err := out.flatTransports(); err != nil {
		return out, err
	}
	if out.Identity == nil {
		k, _, err := crypto.GenerateEd25519Key(nil)
		if err != nil {
			return out, err
		}
		out.Identity = k
	}
	if len(out.ListenAddrs) == 0 {
		out.ListenAddrs = []string{"/ip4/127.0.0.1/tcp/0"}
	}
	if out.IgnoreEnv {
		out.Transports.IgnoreEnv = true
	}
	if !out.IgnoreEnv {
		if v, ok := os.LookupEnv(EnvDevices); ok {
			vis, err := parseVisible(v)
			if err != nil {
				return out, fmt.Errorf("rdt: %s: %w", EnvDevices, err)
			}
			if vis != nil {
				out.VisibleDevices = vis
			}
		} else if vis, name, set, err := visibleFromDriverEnv(); set && out.VisibleDevices == nil {
			// What the scheduler handed this process (Ray, Slurm, k8s):
			// CUDA_VISIBLE_DEVICES, HIP_VISIBLE_DEVICES, ROCR_VISIBLE_DEVICES.
			if err != nil {
				return out, fmt.Errorf("rdt: %s: %w (set %s to override)", name, err, EnvDevices)
			}
			out.VisibleDevices = vis
		}
		if out.RuntimeDir == "" {
			out.RuntimeDir = os.Getenv(EnvRuntimeDir)
		}
	}
	if out.RuntimeDir == "" {
		out.RuntimeDir = defaultRuntimeDir(out.Logger)
	}
	if out.TransferTimeout <= 0 {
		out.TransferTimeout = schema.DefaultDuration("transfer_timeout")
	}
	if out.StallTimeout <= 0 {
		out.StallTimeout = schema.DefaultDuration("stall_timeout")
	}
	if out.LeaseRenew <= 0 {
		out.LeaseRenew = schema.DefaultDuration("lease_renew")
	}
	if out.LeaseExpiry <= 0 {
		out.LeaseExpiry = 3 * out.LeaseRenew
	}
	if out.LeaseExpiry <= out.LeaseRenew {
		return out, badField("lease_expiry", "LeaseExpiry %v must exceed LeaseRenew %v", out.LeaseExpiry, out.LeaseRenew)
	}
	if out.HeartbeatInterval <= 0 {
		out.HeartbeatInterval = schema.DefaultDuration("heartbeat_interval")
	}
	if out.HeartbeatMisses <= 0 {
		out.HeartbeatMisses = schema.DefaultInt("heartbeat_misses")
	}
	if out.Clock == nil {
		out.Clock = clockwork.NewRealClock()
	}
	if out.Transports.Clock == nil {
		out.Transports.Clock = out.Clock // one clock for the whole runtime
	}
	if out.ClusterKey != nil && len(out.ClusterKey) != 32 {
		return out, badField("cluster_key", "ClusterKey must be 32 bytes, got %d", len(out.ClusterKey))
	}
	if out.InboxSize <= 0 {
		out.InboxSize = schema.DefaultInt("inbox_size")
	}
	if out.Logger == nil {
		out.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	return out, nil
}

// badField is a Config field the runtime cannot use: an invalid argument
// that names the field (schema.FieldError).
func badField(name, format string, args ...any) error {
	return fmt.Errorf("rdt: %w: %w", ErrInvalidArgument, schema.Bad(name, format, args...))
}

// flatTransports moves the transport fields that need no fabric import into
// Transports, refusing one setting given two different ways.
func (c *Config) flatTransports() error {
	t := &c.Transports
	for _, f := range []struct {
		name, stackName string
		flat, in        *[]string
	}{{"allow_transports", "Allow", &c.AllowTransports, &t.Allow}, {"deny_transports", "Deny", &c.DenyTransports, &t.Deny}} {
		for _, n := range *f.flat {
			if !fabric.Known(n) {
				return badField(f.name, "unknown transport %q (known: %s)", n, strings.Join(fabric.Names(), ", "))
			}
		}
		switch {
		case *f.flat == nil:
		case *f.in != nil && !slices.Equal(*f.flat, *f.in):
			return badField(f.name, "set it or Transports.%s, not both", f.stackName)
		default:
			*f.in = slices.Clone(*f.flat)
		}
	}
	for _, f := range []struct {
		name, stackName string
		flat, in        *string
	}{{"data_addr", "DataAddr", &c.DataAddr, &t.DataAddr}, {"rdma_provider", "RDMAProviderKind", &c.RDMAProvider, &t.RDMAProviderKind}} {
		switch {
		case *f.flat == "":
		case *f.in != "" && *f.in != *f.flat:
			return badField(f.name, "set it or Transports.%s, not both", f.stackName)
		default:
			*f.in = *f.flat
		}
	}
	t.DisableRDMA = t.DisableRDMA || c.DisableRDMA
	return nil
}
