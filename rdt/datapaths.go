package rdt

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/tensor"
)

// startDataPaths starts the runtime's data transports (fabric/stack): tcp,
// local and p2p in this process, p2p and shm to runtimes on the same host
// (memfd passing over a Unix socket), rdma to other hosts (through the NICs
// of its topology host). The stack starts each optional path it can; one
// that cannot start is logged and left out, and the planner then reports
// it as not running, so the fallback is visible in Explain and in the
// metrics.
func (r *Runtime) startDataPaths(ctx context.Context, reg prometheus.Registerer) (*stack.Stack, error) {
	c := r.cfg
	return stack.Start(ctx, c.Transports, stack.Node{
		Security: fabric.Security{Identity: c.Identity, ClusterKey: c.ClusterKey, EncryptData: c.EncryptData, AllowPeer: r.authorize,
			StallTimeout: c.StallTimeout, Logger: r.log},
		Process: r.process, Cluster: c.Cluster, Host: c.Host,
		Source: r.objects, Sink: r.sinks, Registerer: reg, Slabs: r.slabExporters(),
	})
}

// slabExporters are the runtime's slab memories: the shm owner announces
// their slabs to same-host readers of its trust scope, which then build
// their page tables before their first read (fabric/shm prefetch).
func (r *Runtime) slabExporters() []tensor.SlabExporter {
	var out []tensor.SlabExporter
	for _, id := range r.devs.IDs() {
		m, _ := r.devs.Memory(id)
		if se, ok := m.(tensor.SlabExporter); ok {
			out = append(out, se)
		}
	}
	return out
}

// dataAddrs are the addresses refs carry, by transport name.
func (r *Runtime) dataAddrs() map[string]string { return r.paths.Addrs() }

// servedTransports lists what refs say the owner serves.
func (r *Runtime) servedTransports() []string { return r.paths.Served() }

// revokeRegistrations drops the rdma registrations of a freed object at
// once, so a reader holding its keys gets an access error, never stale data.
func (r *Runtime) revokeRegistrations(id fabric.ObjectID) {
	if r.paths != nil {
		r.paths.Revoke(id)
	}
}

// LinkStats is one of this runtime's data connections (a tcp stream, an
// rdma rail) as link telemetry saw it at its last refresh: rdt's copy of
// fabric/linkstat's figures, so a caller needs no transport package.
type LinkStats struct {
	Link      string `json:"link"`      // e.g. "h0/mlx5_0->h1/mlx5_0" or "h1 tcp->..."
	Transport string `json:"transport"` // "tcp", "rdma"
	Peer      string `json:"peer"`
	Local     string `json:"local"`
	Remote    string `json:"remote"`
	Source    string `json:"source"` // how the figures were measured
	// RTT is the kernel's smoothed round-trip time, MinRTT its windowed
	// minimum.
	RTT               time.Duration `json:"rtt_ns"`
	MinRTT            time.Duration `json:"min_rtt_ns"`
	Retransmits       uint64        `json:"retransmits"` // over the connection's life
	BytesSent         uint64        `json:"bytes_sent"`  // acknowledged by the peer
	BytesReceived     uint64        `json:"bytes_received"`
	Degraded          bool          `json:"degraded"`
	Reason            string        `json:"reason,omitempty"`
	RecentRetransmits uint64        `json:"recent_retransmits"` // in the last interval the health check looked at
	RecentSegments    uint64        `json:"recent_segments"`
	Updated           time.Time     `json:"updated"`
}

// Links reports this runtime's data connections as link telemetry saw
// them at its last refresh, degraded ones with the reason; nil when link
// telemetry is off (Config.Transports.LinkMonitor,
// Config.Transports.LinkTelemetry).
func (r *Runtime) Links() []LinkStats {
	in := r.paths.Links()
	if in == nil {
		return nil
	}
	out := make([]LinkStats, len(in))
	for i, l := range in {
		out[i] = LinkStats{Link: l.Link, Transport: l.Transport, Peer: l.Peer, Local: l.Local, Remote: l.Remote, Source: string(l.Source),
			RTT: l.RTT, MinRTT: l.MinRTT, Retransmits: l.Retransmits, BytesSent: l.BytesSent, BytesReceived: l.BytesReceived,
			Degraded: l.Degraded, Reason: l.Reason, RecentRetransmits: l.RecentRetransmits, RecentSegments: l.RecentSegments, Updated: l.Updated}
	}
	return out
}

// RefreshLinks measures this runtime's data connections now (Links then
// shows the figures); false when link telemetry is off.
func (r *Runtime) RefreshLinks() bool {
	m := r.paths.LinkMonitor()
	if m == nil {
		return false
	}
	m.Refresh()
	return true
}
