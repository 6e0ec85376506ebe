package rdt

import (
	"context"

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
		Security: fabric.Security{Identity: c.Identity, PSK: c.ClusterKey, Encrypt: c.EncryptData, Authorize: r.authorize,
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
	for _, m := range r.devices {
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

// Links reports this runtime's data connections (tcp streams, rdma rails)
// as link telemetry saw them at its last refresh, degraded ones with the
// reason; nil when link telemetry is off (Config.Transports.LinkMonitor,
// Config.Transports.LinkTelemetry).
func (r *Runtime) Links() []stack.LinkStats { return r.paths.Links() }

// LinkMonitor is the monitor measuring this runtime's data connections
// (nil when link telemetry is off), e.g. for a dashboard's Links.
func (r *Runtime) LinkMonitor() *stack.Monitor { return r.paths.LinkMonitor() }
