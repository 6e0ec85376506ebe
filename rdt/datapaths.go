package rdt

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/ofi"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
	"github.com/tensorlane/tensorlane/fabric/shm"
	"github.com/tensorlane/tensorlane/tensor"
)

// dataPaths are the cross-process transports a runtime serves and reads
// with besides tcp: p2p and shm to runtimes on the same host (memfd passing
// over a Unix socket), rdma to other hosts (through the NICs of its
// topology host). Each is optional: a path that cannot start is logged and
// left out, and the planner then reports it as not running, so the
// fallback is visible in Explain and in the metrics.
type dataPaths struct {
	shmSrv *shm.Server
	shmCli *shm.Client

	rdmaSrv  *rdma.Server
	rdmaTr   *rdma.Transport
	rdmaProv rdma.Provider
}

// startDataPaths starts the servers and returns the reader-side transports.
func (r *Runtime) startDataPaths(ctx context.Context) []fabric.Transport {
	var out []fabric.Transport
	c := r.cfg
	if !c.DisableSHM {
		var err error
		r.paths.shmSrv, err = shm.Listen(shm.ServerConfig{
			Identity: c.Identity, Source: r.objects, Sink: r.sinks, Authorize: r.authorize, PSK: c.ClusterKey,
			Dir: c.SHMDir, StallTimeout: c.StallTimeout, Logger: r.log, Limits: c.DataLimits, ListenerMetrics: r.listen,
		})
		if err == nil {
			r.paths.shmCli, err = shm.NewClient(shm.Config{
				Identity: c.Identity, Topology: c.Cluster, PSK: c.ClusterKey, StallTimeout: c.StallTimeout, Logger: r.log,
				Registerer: r.shmRegisterer(),
			})
		}
		if err != nil {
			r.log.Warn("shared-memory paths (p2p, shm) not started: same-host readers in other processes fall back", "err", err)
			r.closeSHM(true)
		} else {
			out = append(out, r.paths.shmCli.P2P(), r.paths.shmCli.SHM())
		}
	}
	if err := r.startRDMA(ctx); err != nil {
		r.log.Warn("rdma path not started: readers on other hosts fall back to tcp", "err", err)
		r.closeRDMA(true)
	} else if r.paths.rdmaTr != nil {
		out = append(out, r.paths.rdmaTr)
	}
	return out
}

// startRDMA serves the host's RDMA NICs through Config.RDMAProvider or,
// by default on simulated hosts, through the software provider: one TCP
// listener per NIC (Config.RDMAAddrs, default loopback), so every NIC is a
// real, separately measured rail.
func (r *Runtime) startRDMA(ctx context.Context) error {
	c := r.cfg
	if c.DisableRDMA {
		return nil
	}
	if c.EncryptData {
		r.log.Info("rdma not started: EncryptData is set and rdma does not encrypt; tcp serves other hosts")
		return nil
	}
	prov := c.RDMAProvider
	kind := c.RDMAProviderKind
	if kind == "" && !c.IgnoreEnv {
		kind = os.Getenv("TENSORLANE_RDMA_PROVIDER")
	}
	switch kind {
	case "", "soft", "softrdma":
	case "ofi":
		if prov == nil {
			ocfg := ofi.Config{}
			if !c.IgnoreEnv {
				ocfg = ofi.FromEnv()
			}
			p, err := ofi.New(ocfg)
			if err != nil {
				return fmt.Errorf("rdt: rdma provider ofi: %w", err)
			}
			prov = p
			r.log.Info("rdma served by libfabric", "provider", p.Fabric(), "nics", len(p.Devices()))
		}
	default:
		return fmt.Errorf("rdt: unknown rdma provider %q (soft or ofi)", kind)
	}
	if prov == nil {
		if r.topoHost == nil {
			return nil
		}
		dataHost, _, err := net.SplitHostPort(c.DataAddr)
		if err != nil || dataHost == "" {
			dataHost = "127.0.0.1"
		}
		var nics []softrdma.NIC
		for _, n := range r.topoHost.NICs {
			if !n.RDMA() {
				continue
			}
			addr := c.RDMAAddrs[n.Name]
			if addr == "" {
				addr = c.RDMAAddrs[n.RDMADevice]
			}
			if addr == "" {
				if !r.topoHost.Simulated {
					continue // a real host needs a real provider (or explicit addresses)
				}
				// Simulated NICs listen where the tcp data server does, so
				// a runtime in a network namespace is reachable on both.
				addr = net.JoinHostPort(dataHost, "0")
			}
			nics = append(nics, softrdma.NIC{Name: n.Name, Addr: addr, Dial: r.health.nicDial(n.Name, nil), Listen: r.health.nicListen(n.Name, nil)})
		}
		if len(nics) == 0 {
			return nil
		}
		p, err := softrdma.New(softrdma.Config{NICs: nics})
		if err != nil {
			return err
		}
		prov = p
		r.log.Info("rdma served by the software provider (simulated NICs over TCP)", "nics", len(nics))
	}
	r.paths.rdmaProv = prov
	var err error
	r.paths.rdmaSrv, err = rdma.Listen(ctx, rdma.ServerConfig{
		Provider: prov, Identity: c.Identity, PSK: c.ClusterKey, Source: r.objects, Sink: r.sinks, Authorize: r.authorize, Logger: r.log,
		Limits: c.DataLimits, ListenerMetrics: r.listen,
	})
	if err != nil {
		return err
	}
	r.paths.rdmaTr, err = rdma.New(ctx, rdma.Config{
		Provider: prov, Identity: c.Identity, PSK: c.ClusterKey, Topology: c.Cluster, Host: c.Host, Logger: r.log,
		Metrics: rdma.NewMetrics(r.registerer()),
	})
	if err == nil {
		r.health.setRDMA(r.paths.rdmaTr)
	}
	return err
}

// shmRegisterer is where the shm client's metrics (tensorlane_shm_*:
// mapping cache, slab mappings) go: the runtime's private registry only,
// since the collector's series carry no runtime label and a Registerer
// shared by several runtimes would refuse the second.
func (r *Runtime) shmRegisterer() prometheus.Registerer {
	if r.cfg.Registerer != nil {
		return nil
	}
	return r.registry
}

// registerer is where the runtime's metrics go.
func (r *Runtime) registerer() prometheus.Registerer {
	if r.cfg.Registerer != nil {
		return r.cfg.Registerer
	}
	return r.registry
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
func (r *Runtime) dataAddrs() map[string]string {
	m := map[string]string{fabric.TCP: r.tcpSrv.Addr()}
	if r.paths.shmSrv != nil && r.paths.shmCli != nil {
		m[fabric.SHM] = r.paths.shmSrv.Addr()
	}
	if r.paths.rdmaSrv != nil && r.paths.rdmaTr != nil {
		m[fabric.RDMA] = r.paths.rdmaSrv.Addr()
	}
	return m
}

// servedTransports lists what refs say the owner serves.
func (r *Runtime) servedTransports() []string {
	out := []string{fabric.Local, fabric.P2P}
	if r.paths.shmSrv != nil && r.paths.shmCli != nil {
		out = append(out, fabric.SHM)
	}
	if r.paths.rdmaSrv != nil && r.paths.rdmaTr != nil {
		out = append(out, fabric.RDMA)
	}
	return append(out, fabric.TCP)
}

// revokeRegistrations drops the rdma registrations of a freed object at
// once, so a reader holding its keys gets an access error, never stale data.
func (r *Runtime) revokeRegistrations(id fabric.ObjectID) {
	if r.paths.rdmaSrv != nil {
		r.paths.rdmaSrv.Revoke(id)
	}
}

// closeSHM closes the shm paths. forget drops them too (a start-up failure:
// the runtime then runs without them); at teardown they stay set, since
// refs being built concurrently still read them, and Close is idempotent.
func (r *Runtime) closeSHM(forget bool) error {
	var errs []error
	if r.paths.shmSrv != nil {
		errs = append(errs, r.paths.shmSrv.Close())
	}
	if r.paths.shmCli != nil {
		errs = append(errs, r.paths.shmCli.Close())
	}
	if forget {
		r.paths.shmSrv, r.paths.shmCli = nil, nil
	}
	return errors.Join(errs...)
}

// closeRDMA closes the rdma path; forget as for closeSHM.
func (r *Runtime) closeRDMA(forget bool) error {
	var errs []error
	if r.paths.rdmaTr != nil {
		errs = append(errs, r.paths.rdmaTr.Close())
	}
	if r.paths.rdmaSrv != nil {
		errs = append(errs, r.paths.rdmaSrv.Close())
	}
	if forget {
		r.paths.rdmaTr, r.paths.rdmaSrv, r.paths.rdmaProv = nil, nil, nil
	}
	return errors.Join(errs...)
}

func (r *Runtime) closeDataPaths() error {
	// Health first: it acts on the rdma transport.
	if err := errors.Join(r.health.close(), r.closeRDMA(false), r.closeSHM(false)); err != nil {
		return fmt.Errorf("rdt: close data paths: %w", err)
	}
	return nil
}
