package stack

import (
	"fmt"
	"os"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/linkstat"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Environment variables read unless Config.IgnoreEnv is set.
const (
	// EnvTransports narrows the transports ("tcp,shm", "-rdma"); see
	// fabric.ParseSelection.
	EnvTransports = fabric.EnvTransports
	// EnvRDMAProvider picks the rdma provider when Config.RDMAProviderKind
	// is empty: "soft" or "ofi".
	EnvRDMAProvider = "TENSORLANE_RDMA_PROVIDER"
	// The libfabric provider itself (TENSORLANE_OFI_PROVIDER, ...) is read
	// by fabric/rdma/ofi.FromEnv.
)

// Config is the transport settings of one runtime: which transports run
// and how they are tuned. The zero value is valid and means: every
// transport allowed except as narrowed by TENSORLANE_TRANSPORTS, the tcp
// data listener on 127.0.0.1:0, fabric's listener limits, 4 streams per
// large tcp read, compression when the link is slower than the codec, the
// shared-memory paths in shm.DefaultDir(), rdma through the software
// provider on simulated hosts (TENSORLANE_RDMA_PROVIDER may say "ofi"),
// and no link telemetry.
type Config struct {
	// Allow and Deny narrow the transports (names as in
	// fabric.Names()). TENSORLANE_TRANSPORTS applies on top unless
	// IgnoreEnv is set.
	Allow, Deny []string
	// IgnoreEnv makes the stack read no environment variable.
	IgnoreEnv bool

	// DataAddr is the tcp data listener. Default: 127.0.0.1:0.
	DataAddr string
	// Limits caps the connections each data listener (tcp, shm, each
	// rdma rail) holds, in total and per peer, and closes authenticated
	// data connections idle for longer than Limits.IdleTimeout. Zero
	// values mean fabric's defaults (1024 in total, 128 per peer, 5 min);
	// the caps and every rejection are in the tensorlane_listener_* metrics.
	Limits fabric.ListenerLimits
	// Streams is the most tcp connections one large read is striped over.
	// Default 4.
	Streams int
	// Compression says when tcp transfers are compressed (lossless tensor
	// codec): tcp.CompressAuto (default: only when the link to the peer is
	// measured slower than the codec), tcp.CompressOff or
	// tcp.CompressAlways.
	Compression tcp.Compression

	// DisableSHM turns off the cross-process same-host paths (p2p and shm
	// over shared memory). SHMDir is the private directory of their Unix
	// socket; default shm.DefaultDir().
	DisableSHM bool
	SHMDir     string

	// RDMAProvider serves the rdma path (a verbs provider; see fabric/rdma).
	// Default on simulated hosts: the software provider, one TCP listener
	// per RDMA NIC of the topology host at RDMAAddrs[NIC name] (default:
	// DataAddr's host, port 0), so each NIC is a real, separately measured
	// rail. Queue pairs prove the cluster key when one is set (a provider
	// that cannot must fail). RDMA moves bytes between device memories
	// without encrypting them, so Node.EncryptData turns the path off,
	// whatever the provider (tcp serves instead, the log and Explain say
	// so). DisableRDMA turns the path off.
	RDMAProvider rdma.Provider
	RDMAAddrs    map[string]string
	DisableRDMA  bool
	// RDMAProviderKind picks the provider when RDMAProvider is nil: "soft"
	// (the default above) or "ofi" (libfabric, fabric/rdma/ofi; needs a
	// binary built with -tags ofi; TENSORLANE_OFI_PROVIDER names the
	// libfabric provider, unless IgnoreEnv). Default: TENSORLANE_RDMA_PROVIDER
	// (unless IgnoreEnv), else "soft". An "ofi" (or unknown kind) that
	// cannot start leaves the rdma path off with a warning naming why, as
	// any rdma failure does: tcp serves the other hosts.
	RDMAProviderKind string

	// LinkMonitor, if set, measures the data connections (tcp streams and
	// the software provider's rdma rails) and feeds path health: a rail
	// whose connection it reports degraded (RTT far above its minimum, or
	// retransmissions) gets no new slices until it recovers or
	// LinkHealthPause passes. Owners' accepted rail connections are
	// tracked too: for a READ they send the data, so they see a bad link
	// first, and on a monitor shared by the stacks of a process the
	// owner's end speaks for the reader's rail (across processes only the
	// reader's own end does). LinkTelemetry makes the stack create its own
	// (eBPF, else TCP_INFO polling; metrics on Node.Registerer) and close
	// it. Default off. Cost: a map lookup (eBPF) or a getsockopt
	// (TCP_INFO) per connection and refresh (1 s), and in eBPF mode a
	// sock_ops program on every TCP socket of the process's cgroup.
	LinkMonitor   *linkstat.Monitor
	LinkTelemetry bool
	// LinkHealthPause is how long a degraded rail first gets no slices
	// (then it is tried again; each time it is still degraded under
	// traffic the pause doubles, up to 8x). Default 10 s.
	LinkHealthPause time.Duration
	// Clock times the rdma rails' pauses and degraded marks and the link
	// health marks (LinkHealthPause); default the wall clock. Tests pass
	// a clockwork.FakeClock to run a pause out without waiting for it.
	Clock clockwork.Clock
}

// Node is who the stack serves: the runtime's security block (handed to
// every transport alike), its place in the topology and its object
// tables. The runtime fills it in; these are not user settings of the
// transports.
type Node struct {
	// Security: Identity (required), ClusterKey (the cluster key, proven in
	// every data handshake and by rdma queue pairs), EncryptData (encrypts tcp
	// data connections and turns rdma off: it does not encrypt),
	// AllowPeer (nil admits every authenticated peer), StallTimeout
	// (default 30 s) and Logger (default: discard); see fabric.Security.
	fabric.Security
	// Process is the runtime's instance ID (fabric.Endpoint.Process);
	// Cluster and Host place it in the topology. Cluster is required.
	Process string
	Cluster *topology.Cluster
	Host    string
	// Source resolves claims of objects this runtime owns (required); Sink
	// resolves the claims of pushes into its slots (nil refuses pushes).
	Source fabric.Source
	Sink   fabric.Sink
	// Slabs are the runtime's slab memories, whose slabs the shm owner
	// announces to same-host readers of its trust scope (see
	// fabric/shm's prefetch); nil announces none.
	Slabs []tensor.SlabExporter
	// Registerer receives the transports' and listeners' metrics; default
	// a private registry.
	Registerer prometheus.Registerer
}

// withDefaults resolves c: the environment (unless IgnoreEnv) and the
// documented defaults.
func (c Config) withDefaults() (Config, error) {
	out := c
	out.Allow = append([]string(nil), c.Allow...)
	out.Deny = append([]string(nil), c.Deny...)
	if !out.IgnoreEnv {
		allow, deny, err := fabric.ParseSelection(os.Getenv(EnvTransports))
		if err != nil {
			return out, fmt.Errorf("stack: %s: %w", EnvTransports, err)
		}
		if allow != nil {
			out.Allow = allow
		}
		out.Deny = append(out.Deny, deny...)
		if out.RDMAProviderKind == "" {
			out.RDMAProviderKind = os.Getenv(EnvRDMAProvider)
		}
	}
	if out.DataAddr == "" {
		out.DataAddr = "127.0.0.1:0"
	}
	if out.Streams <= 0 {
		out.Streams = 4
	}
	if out.LinkHealthPause <= 0 {
		out.LinkHealthPause = 10 * time.Second
	}
	if out.Clock == nil {
		out.Clock = clockwork.NewRealClock()
	}
	return out, nil
}

func (n Node) withDefaults() (Node, error) {
	if err := n.Security.Defaults("stack: Node"); err != nil {
		return n, err
	}
	if n.Cluster == nil {
		return n, fmt.Errorf("stack: Node.Cluster is required")
	}
	if n.Source == nil {
		return n, fmt.Errorf("stack: Node.Source is required")
	}
	if n.Registerer == nil {
		n.Registerer = prometheus.NewRegistry()
	}
	return n, nil
}
