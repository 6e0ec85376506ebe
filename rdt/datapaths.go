package rdt

import (
	"context"
	"errors"

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
	for _, m := range r.devices {
		if se, ok := m.(tensor.SlabExporter); ok {
			out = append(out, se)
		}
	}
	return out
}

// Export shares a pinned object's published view with another process
// (the p2p and shm paths map it) for as long as the pin is held.
//
// A descriptor reaches a whole allocation (tensor.Exportable, as CUDA's
// handles do), so an object that is all of its allocation is shared as it
// is, and a view of part of one is shared as a private, sealed copy of
// exactly the view (tensor.ViewShare), staged at the first grant and kept
// until the object's memory is released. Staging is reported (metrics,
// debug log, ObjectInfo.StagedBytes); a copy that does not fit on the
// device fails the grant with tensor.ErrViewCopy (a tensor.ErrNotExportable),
// and the reader falls back, loudly, to a path that needs no descriptor.
func (p *pin) Export(a tensor.Access) (tensor.Handle, error) {
	h, staged, err := p.obj.share.Export(a)
	if (staged > 0 || errors.Is(err, tensor.ErrViewCopy)) && p.table.onStage != nil {
		p.table.onStage(p.obj, staged, err)
	}
	return h, err
}

// Unwrap names the object's buffer, so copies reach device memory that is
// not host visible (tensor.Copy).
func (p *pin) Unwrap() (tensor.Buffer, int64) { return p.obj.buf, 0 }

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
