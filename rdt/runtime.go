package rdt

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/stack"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlhost"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlmsg"
	"github.com/tensorlane/tensorlane/rdt/internal/devset"
	"github.com/tensorlane/tensorlane/rdt/internal/faults"
	"github.com/tensorlane/tensorlane/rdt/internal/leases"
	"github.com/tensorlane/tensorlane/rdt/internal/life"
	"github.com/tensorlane/tensorlane/rdt/internal/notices"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/observe"
	"github.com/tensorlane/tensorlane/rdt/internal/peers"
	"github.com/tensorlane/tensorlane/rdt/internal/reader"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/backend"
	"github.com/tensorlane/tensorlane/topology"
)

// Runtime is one tensorlane process, or one simulated host inside a process:
// it owns device memory, an object table, a libp2p control host, the data
// transports (a fabric/stack) and the actors spawned on it.
type Runtime struct {
	cfg         Config
	log         *slog.Logger
	host        host.Host
	incarnation uint64
	process     string
	topoHost    *topology.Host

	devs *devset.Set // the devices it serves (devset: given, or opened through tensor/backend)

	objects  *objstore.Table
	sinks    *objstore.Sinks
	notices  notices.Pool // the push-notice streams per slot runtime
	paths    *stack.Stack // the data transports and their servers (datapaths.go)
	planner  *fabric.Planner
	registry *prometheus.Registry
	metrics  *fabric.Metrics
	obs      *observe.Ring    // recent and live transfers, for dashboards (observe.go)
	bcast    *bcastrun.Owner  // broadcasts this runtime owns, generations its readers are done with
	relays   *bcastrun.Relays // its slots' side of broadcasts
	reader   *reader.Reader   // the read side: Gets, views, holds (reader.go)

	mu     sync.Mutex
	actors map[string]*Actor
	closed bool
	done   chan struct{}

	// Lifecycle (lease.go, peers.go, life.go).
	peers       *peers.Table
	lifeMetrics *life.Metrics
	leases      *leases.Table // leases this runtime holds as a reader (lease.go)
	unclaim     func()        // drops the device claims (claims.go)
	ctl         ctlmsg.Gate   // control handlers in flight (control.go)
	loops       sync.WaitGroup
	stopLoops   context.CancelFunc
	faults      faults.Sim // failures the tests simulate (a hung process, a crashed reader)

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
	r := &Runtime{cfg: c, actors: map[string]*Actor{}, done: make(chan struct{})}
	r.topoHost, _ = c.Cluster.Host(c.Host)
	var inc [8]byte
	rand.Read(inc[:])
	r.incarnation = binary.BigEndian.Uint64(inc[:]) | 1
	r.objects = objstore.New(r.incarnation)
	r.sinks = objstore.NewSinks(r.incarnation)
	r.objects.SetHooks(objstore.Hooks{
		OnFree: func(id fabric.ObjectID, why string) {
			r.revokeRegistrations(id)
			r.lifeMetrics.ObjectsFreed.WithLabelValues(why).Inc()
		},
		Blocked: r.blockedRead, OnStage: r.viewStaged,
	})

	ok := false
	defer func() {
		if !ok {
			r.teardown()
		}
	}()
	if err := r.setupDevices(); err != nil {
		return nil, err
	}
	hc := ctlhost.Config{Identity: c.Identity, ListenAddrs: c.ListenAddrs, ClusterKey: c.ClusterKey}
	if len(c.AllowPeers) > 0 {
		hc.Authorize = func(id peer.ID) bool {
			err := r.authorize(id)
			if err != nil {
				r.log.Warn("control connection refused", "peer", id, "err", err)
			}
			return err == nil
		}
	}
	r.host, err = ctlhost.New(hc)
	if err != nil {
		return nil, fmt.Errorf("rdt: start control host: %w", err)
	}
	r.process = fmt.Sprintf("%s/%x", r.host.ID(), r.incarnation)
	r.notices.Host, r.notices.Protocol, r.notices.Timeout = r.host, pushProtocol, controlTimeout
	r.log = c.Logger.With("runtime", c.Host, "peer", shortID(r.host.ID()))

	r.registry = prometheus.NewRegistry()
	var reg prometheus.Registerer = r.registry
	if c.Registerer != nil {
		reg = c.Registerer
	}
	r.metrics = fabric.NewMetrics(reg)
	r.lifeMetrics = life.NewMetrics(reg, r.holdCount, r.objects.Leases)
	bmet := bcast.NewMetrics(reg)
	r.bcast = bcastrun.NewOwner(bcastrun.Deps{Env: bcastEnv{r}, Cluster: c.Cluster, Objects: r.objects,
		Metrics: bmet, Log: r.log, AbortWait: c.HeartbeatInterval})
	r.relays = bcastrun.NewRelays(bcastrun.RelayDeps{Env: bcastEnv{r}, Sinks: r.sinks, Metrics: bmet, Log: r.log,
		TransferTimeout: c.TransferTimeout, ReportWait: controlTimeout, DropChunks: r.faults.DropChunks.Load, HoldChunk: r.faults.HoldChunk})
	registerNotices(reg, r.sinks) // push notices (pushbatch.go)
	r.obs = newObserver(r, reg)
	r.peers = peers.New(peers.Config{Prober: peerProber{r}, Clock: c.Clock, Interval: c.HeartbeatInterval, Misses: c.HeartbeatMisses,
		Log: r.log, Heartbeats: r.lifeMetrics.Heartbeats})
	r.leases = r.newLeases()
	// The protocols are served once what they use exists.
	r.host.SetStreamHandler(controlProtocol, r.handleControl)
	r.host.SetStreamHandler(life.Protocol, r.handleLife)
	r.host.SetStreamHandler(pushProtocol, r.handlePush)
	ctlhost.OnLastDisconnect(r.host, r.peers.Kick)

	if r.paths, err = r.startDataPaths(ctx, reg); err != nil {
		return nil, err
	}
	tc := r.paths.Config()
	r.planner, err = fabric.NewPlanner(fabric.PlannerConfig{
		Topology: c.Cluster, Allow: tc.Allow, Deny: tc.Deny, Logger: r.log, Metrics: r.metrics,
	}, r.paths.Transports()...)
	if err != nil {
		return nil, err
	}
	r.reader = r.newReader()
	lctx, stop := context.WithCancel(context.Background())
	r.stopLoops = stop
	r.loops.Add(2)
	go r.lifeLoop(lctx)
	go func() { defer r.loops.Done(); r.leases.Keep(lctx) }()
	ok = true
	r.log.Info("runtime started", "host", c.Host, "devices", len(r.devs.IDs()), "control", r.host.Addrs(), "data", r.paths.TCPAddr(), "simulated", r.topoHost.Simulated)
	return r, nil
}

func (r *Runtime) setupDevices() error {
	mode := r.cfg.DeviceBackend
	if mode == "" && !r.cfg.IgnoreEnv {
		mode = backend.ModeFromEnv()
	}
	devs, err := devset.Open(devset.Config{Given: r.cfg.Devices, Host: r.topoHost, Mode: mode, Visible: r.cfg.VisibleDevices,
		Capacity: r.cfg.DeviceMemory, HostMemory: r.cfg.HostMemory, Log: r.cfg.Logger})
	if err != nil {
		return err
	}
	r.devs = devs
	release, err := claimDevices(r.cfg.RuntimeDir, r.cfg.Cluster.Name, r.cfg.Host, r.Devices()) // claims.go
	if err != nil {
		return err
	}
	r.unclaim = release
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
	// An explicit Connect overrides the dial backoff of earlier failures,
	// so a peer that restarted is reachable at once.
	ctlhost.ClearBackoff(r.host, info.ID)
	if err := r.host.Connect(ctx, info); err != nil {
		return fmt.Errorf("%w: connect to %s: %w", ErrPeerUnreachable, shortID(info.ID), err)
	}
	return nil
}

// Devices lists the runtime's devices, host memory first, then by kind and
// index.
func (r *Runtime) Devices() []tensor.DeviceID { return r.devs.IDs() }

// Memory returns a device's memory.
func (r *Runtime) Memory(dev tensor.DeviceID) (tensor.Memory, error) {
	m, ok := r.devs.Memory(dev)
	if !ok {
		return nil, fmt.Errorf("%w: %v on host %s", ErrUnknownDevice, dev, r.cfg.Host)
	}
	return m, nil
}

// Registry returns the runtime's private metrics registry (empty when
// Config.Registerer was set).
func (r *Runtime) Registry() *prometheus.Registry { return r.registry }

// TCPBlocksServed is how many raw blocks this runtime's tcp owner has sent
// with a checksum: zero while no reader on another host has read from it
// over tcp (a caller deciding whether checksums made ahead of a read will
// be used).
func (r *Runtime) TCPBlocksServed() int64 {
	if r.paths == nil {
		return 0
	}
	s := r.paths.TCPSendSums()
	return s.Cached + s.Stored + s.Computed
}

// Objects is the number of live objects this runtime owns.
func (r *Runtime) Objects() int { return r.objects.Len() }

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

// ShutdownGrace bounds how long Shutdown lets transfers in flight finish
// when its context has no deadline.
const ShutdownGrace = 10 * time.Second

// Shutdown stops the runtime: it refuses new work at once, on both sides
// (its own Gets, Puts and Sends fail with ErrClosed; other runtimes' new
// leases, reads on every data path and pushes into its slots fail with
// ErrOwnerClosed), lets Gets and reads in flight finish until ctx is done
// (ShutdownGrace without a deadline) and goes on as soon as they have, then
// aborts the rest, releases the leases it holds on others' objects, stops
// heartbeats and watchers, frees every object it owns, closes connections
// and listeners and returns device memory. No goroutine of the runtime
// survives it. Later calls return the first call's result.
func (r *Runtime) Shutdown(ctx context.Context) error {
	r.shutdownOnce.Do(func() {
		r.mu.Lock()
		r.closed = true
		close(r.done)
		r.mu.Unlock()
		gets := r.reader.Close()
		// Owner side: no new pins, leases or pushes from here on, so the
		// reads in flight are all there is to drain.
		inFlight := r.objects.Close()
		r.sinks.Close()
		r.log.Info("shutting down: new leases, reads and pushes refused", "reads_in_flight", inFlight)
		if r.host != nil {
			r.host.RemoveStreamHandler(controlProtocol)
		}
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, ShutdownGrace)
			defer cancel()
		}
		// Finish what is in flight, within ctx.
		select {
		case <-gets:
		case <-ctx.Done():
		}
		select {
		case <-r.objects.Drained():
		case <-ctx.Done():
		}
		// Abort the rest: cancelled Gets release their buffers as they
		// return, which the transports make prompt.
		if aborted := r.reader.Abort(fmt.Errorf("%w: aborted by Shutdown", ErrClosed)); aborted > 0 {
			r.log.Warn("shutdown aborted transfers in flight", "count", aborted)
		}
		<-gets
		r.ctl.Drain(ctx) // answer the messages already queued (control.go)
		if !r.faults.AbandonHolds.Load() {
			r.leases.ReleaseAll(ctx)
		}
		if r.host != nil {
			r.host.RemoveStreamHandler(life.Protocol)
		}
		r.stopLoops()
		r.loops.Wait()
		r.peers.Stop()
		r.shutdownErr = r.teardown()
		r.log.Info("runtime stopped")
	})
	return r.shutdownErr
}

// authorize admits data connections from the allowlist (all when empty).
func (r *Runtime) authorize(id peer.ID) error {
	if len(r.cfg.AllowPeers) == 0 || id == r.host.ID() || slices.Contains(r.cfg.AllowPeers, id) {
		return nil
	}
	return fmt.Errorf("%w: peer %s is not in AllowPeers", ErrUnauthorized, id)
}

// blockedRead is the blackhole hook on the object table: a read hangs until
// the runtime shuts down.
func (r *Runtime) blockedRead(ctx context.Context) error {
	if !r.faults.ReadsBlocked() {
		return nil
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-r.done:
		return ErrClosed
	}
}

// learnAddrs adds a ref's owner addresses to the peerstore so the control
// channel can reach an owner this runtime never connected to.
func (r *Runtime) learnAddrs(ref Ref) {
	ctlhost.Learn(r.host, ref.Owner, ref.Addrs)
	// A ref of an incarnation that never answered here is news of a new
	// life of its owner (a restart): dials that failed while an earlier one
	// was down say nothing about it, so their backoff must not delay it.
	if !r.peers.SeenAlive(ref.Owner, ref.Incarnation) {
		ctlhost.ClearBackoff(r.host, ref.Owner)
	}
}

// WatchPeer reports liveness changes of a peer until ctx is done or the
// runtime shuts down, when the channel is closed. While watched, the peer is
// sent a heartbeat every HeartbeatInterval. The first event is PeerAlive once
// the peer answers; a peer that cannot be reached yields PeerDied (with
// Incarnation 0 if it never answered within the detection bound). The
// peer's addresses must be known: Connect to it first, or hold a ref it
// owns.
func (r *Runtime) WatchPeer(ctx context.Context, id peer.ID) <-chan PeerEvent {
	ch := make(chan PeerEvent, 16)
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		close(ch)
		return ch
	}
	r.loops.Add(1)
	r.mu.Unlock()
	// A watcher that does not keep up loses events; the runtime never
	// loses its liveness checks.
	unwatch := r.peers.Watch(id, func(ev peers.Event) {
		select {
		case ch <- peerEvent(ev):
		default:
		}
	}, func() { close(ch) })
	go func() {
		defer r.loops.Done()
		select {
		case <-ctx.Done():
		case <-r.done:
		}
		unwatch()
	}()
	return ch
}

func (r *Runtime) teardown() error {
	var errs []error
	// The control host goes first: peers see the connection drop and
	// declare this incarnation dead before its data connections close
	// under their transfers.
	r.notices.Close()
	if r.host != nil {
		r.host.RemoveStreamHandler(controlProtocol)
		errs = append(errs, r.host.Close())
	}
	if r.paths != nil {
		errs = append(errs, r.paths.Close())
	}
	for _, id := range r.objects.IDs() {
		if err := r.objects.Free(id); err != nil && !errors.Is(err, ErrObjectNotFound) {
			errs = append(errs, err)
		}
	}
	if r.devs != nil {
		errs = append(errs, r.devs.Close())
	}
	if r.unclaim != nil {
		r.unclaim()
		r.unclaim = nil
	}
	return errors.Join(errs...)
}
