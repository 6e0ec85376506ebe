package rdt

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"sort"
	"sync"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptcp "github.com/libp2p/go-libp2p/p2p/transport/tcp"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/local"
	"github.com/tensorlane/tensorlane/fabric/tcp"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Runtime is one tensorlane process, or one simulated host inside a process:
// it owns device memory, an object table, a libp2p control host, data
// servers, the transports and the actors spawned on it.
type Runtime struct {
	cfg         Config
	log         *slog.Logger
	host        host.Host
	incarnation uint64
	process     string
	topoHost    *topology.Host

	devices map[tensor.DeviceID]tensor.Memory
	owned   []*tensor.SimMemory // arenas this runtime created and closes

	objects  *objectTable
	planner  *fabric.Planner
	tcpSrv   *tcp.Server
	tcpTr    *tcp.Transport
	registry *prometheus.Registry
	metrics  *fabric.Metrics
	obs      observer // recent and live transfers, for dashboards (observe.go)

	mu     sync.Mutex
	actors map[string]*Actor
	closed bool
	done   chan struct{}

	shutdownOnce sync.Once
	shutdownErr  error
}

// New starts a runtime.
func New(ctx context.Context, cfg Config) (*Runtime, error) {
	c, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	r := &Runtime{cfg: c, devices: map[tensor.DeviceID]tensor.Memory{}, actors: map[string]*Actor{}, done: make(chan struct{})}
	r.topoHost, _ = c.Cluster.Host(c.Host)
	var inc [8]byte
	rand.Read(inc[:])
	r.incarnation = binary.BigEndian.Uint64(inc[:]) | 1
	r.objects = newObjectTable(r.incarnation)

	ok := false
	defer func() {
		if !ok {
			r.teardown()
		}
	}()
	if err := r.setupDevices(); err != nil {
		return nil, err
	}
	r.host, err = libp2p.New(
		libp2p.Identity(c.Identity),
		libp2p.ListenAddrStrings(c.ListenAddrs...),
		libp2p.Transport(libp2ptcp.NewTCPTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.DisableRelay(),
		libp2p.ResourceManager(&network.NullResourceManager{}),
	)
	if err != nil {
		return nil, fmt.Errorf("rdt: start control host: %w", err)
	}
	r.process = fmt.Sprintf("%s/%x", r.host.ID(), r.incarnation)
	r.log = c.Logger.With("runtime", c.Host, "peer", shortID(r.host.ID()))
	r.host.SetStreamHandler(controlProtocol, r.handleControl)

	r.registry = prometheus.NewRegistry()
	var reg prometheus.Registerer = r.registry
	if c.Registerer != nil {
		reg = c.Registerer
	}
	r.metrics = fabric.NewMetrics(reg)
	r.obs.init(r, reg)

	r.tcpSrv, err = tcp.Listen(tcp.ServerConfig{Addr: c.DataAddr, Identity: c.Identity, Source: r.objects, StallTimeout: c.StallTimeout, Logger: r.log})
	if err != nil {
		return nil, err
	}
	r.tcpTr, err = tcp.New(tcp.Config{Identity: c.Identity, Streams: c.Streams, StallTimeout: c.StallTimeout, Logger: r.log})
	if err != nil {
		return nil, err
	}
	lc := local.Config{Process: r.process, Source: r.objects, Topology: c.Cluster}
	r.planner, err = fabric.NewPlanner(fabric.PlannerConfig{
		Topology: c.Cluster, Allow: c.Allow, Deny: c.Deny, Logger: r.log, Metrics: r.metrics,
	}, local.New(lc), local.NewP2P(lc), r.tcpTr)
	if err != nil {
		return nil, err
	}
	ok = true
	r.log.Info("runtime started", "host", c.Host, "devices", len(r.devices), "control", r.host.Addrs(), "data", r.tcpSrv.Addr(), "simulated", r.topoHost.Simulated)
	return r, nil
}

func (r *Runtime) setupDevices() error {
	if len(r.cfg.Devices) > 0 {
		for _, m := range r.cfg.Devices {
			if _, dup := r.devices[m.Device()]; dup {
				return fmt.Errorf("rdt: device %v given twice", m.Device())
			}
			r.devices[m.Device()] = m
		}
	} else {
		for _, d := range r.topoHost.Devices {
			id := tensor.DeviceID{Kind: deviceKind(d.Kind), Index: d.Index}
			capacity := d.MemoryBytes
			if r.cfg.DeviceMemory > 0 {
				capacity = r.cfg.DeviceMemory
			}
			m, err := tensor.NewSimMemory(id, capacity)
			if err != nil {
				return err
			}
			r.owned = append(r.owned, m)
			r.devices[id] = m
		}
	}
	if _, ok := r.devices[tensor.HostDevice]; !ok {
		r.devices[tensor.HostDevice] = tensor.NewHostMemory(r.cfg.HostMemory)
	}
	return nil
}

// ID returns the runtime's libp2p peer ID.
func (r *Runtime) ID() peer.ID { return r.host.ID() }

// HostID returns the topology host this runtime claims.
func (r *Runtime) HostID() string { return r.cfg.Host }

// Cluster returns the topology the runtime lives in.
func (r *Runtime) Cluster() *topology.Cluster { return r.cfg.Cluster }

// AddrInfo returns the runtime's peer ID and control addresses, for Connect.
func (r *Runtime) AddrInfo() peer.AddrInfo {
	return peer.AddrInfo{ID: r.host.ID(), Addrs: r.host.Addrs()}
}

// Connect opens the control channel to another runtime.
func (r *Runtime) Connect(ctx context.Context, info peer.AddrInfo) error {
	if r.isClosed() {
		return ErrClosed
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	if err := r.host.Connect(ctx, info); err != nil {
		return fmt.Errorf("rdt: connect to %s: %w", shortID(info.ID), err)
	}
	return nil
}

// Devices lists the runtime's devices, host memory first, then by kind and
// index.
func (r *Runtime) Devices() []tensor.DeviceID {
	out := make([]tensor.DeviceID, 0, len(r.devices))
	for id := range r.devices {
		out = append(out, id)
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].IsHost() != out[j].IsHost() {
			return out[i].IsHost()
		}
		if out[i].Kind != out[j].Kind {
			return out[i].Kind < out[j].Kind
		}
		return out[i].Index < out[j].Index
	})
	return out
}

// Memory returns a device's memory.
func (r *Runtime) Memory(dev tensor.DeviceID) (tensor.Memory, error) {
	m, ok := r.devices[dev]
	if !ok {
		return nil, fmt.Errorf("%w: %v on host %s", ErrUnknownDevice, dev, r.cfg.Host)
	}
	return m, nil
}

// Registry returns the runtime's private metrics registry (empty when
// Config.Registerer was set).
func (r *Runtime) Registry() *prometheus.Registry { return r.registry }

// Objects is the number of live objects this runtime owns.
func (r *Runtime) Objects() int { return r.objects.len() }

func (r *Runtime) endpoint(dev tensor.DeviceID) fabric.Endpoint {
	return fabric.Endpoint{Process: r.process, Host: r.cfg.Host, Device: dev}
}

// bounded gives ctx the default transfer timeout when it has no deadline, so
// no call can block forever.
func (r *Runtime) bounded(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, r.cfg.TransferTimeout)
}

func (r *Runtime) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// Shutdown stops the runtime: it refuses new work, aborts transfers in
// flight, frees every object it owns, closes connections and listeners and
// returns device memory. Later calls return the first call's result.
func (r *Runtime) Shutdown(ctx context.Context) error {
	r.shutdownOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		close(r.done)
		r.mu.Unlock()
		r.shutdownErr = r.teardown()
		r.log.Info("runtime stopped")
	})
	return r.shutdownErr
}

func (r *Runtime) teardown() error {
	var errs []error
	if r.host != nil {
		r.host.RemoveStreamHandler(controlProtocol)
	}
	if r.tcpSrv != nil {
		errs = append(errs, r.tcpSrv.Close())
	}
	if r.tcpTr != nil {
		errs = append(errs, r.tcpTr.Close())
	}
	if r.host != nil {
		errs = append(errs, r.host.Close())
	}
	for _, id := range r.objects.ids() {
		if err := r.objects.free(id); err != nil && !errors.Is(err, ErrObjectNotFound) {
			errs = append(errs, err)
		}
	}
	for _, m := range r.owned {
		errs = append(errs, m.Close())
	}
	return errors.Join(errs...)
}
