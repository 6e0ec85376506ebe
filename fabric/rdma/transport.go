package rdma

import (
	"context"
	"crypto/rand"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/internal/peerauth"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Config configures the reader side of the rdma transport. Zero values
// mean the documented defaults.
type Config struct {
	Provider Provider // required
	// Security: Identity (required), ClusterKey (the cluster key queue pairs
	// must prove, OpenConfig.ClusterKey) and Logger; see fabric.Security. rdma
	// does not encrypt, so EncryptData is refused; progress is bounded by
	// QPTimeout, not StallTimeout.
	fabric.Security
	// NICs names the local provider devices to use; default all.
	NICs []string
	// Topology and Host place this runtime: NICs are chosen nearest the
	// destination device (same PCIe switch, then NUMA node) and the owner's
	// nearest its source device, and Reach requires RDMA NICs on both
	// hosts. Without a topology every NIC is used in the order given.
	Topology *topology.Cluster
	Host     string
	// AllowLoopback lets Reach accept two endpoints on the same host (for
	// tests and single-host setups); rdma is otherwise a cross-host path.
	AllowLoopback bool
	// SliceSize is the unit of striping: larger transfers are cut into
	// slices spread over every rail. Default: 512 KiB, growing with the
	// transfer up to 8 MiB while every rail can still have MaxInFlight
	// slices of it posted. Measured on eight loopback rails: a 1 MiB
	// transfer in two slices (two rails at once) runs at 0.64-0.70 of a
	// raw TCP socket's rate, in one at 0.49-0.59; 64 MiB moves 5-15%
	// faster in 2 MiB slices than in 1 MiB ones (each slice costs a READ
	// round trip and a completion), and more in 8 MiB ones, which would
	// leave no slice for rails still connecting or measured slower. A
	// size set here is used as is.
	SliceSize int64
	// MaxInFlight bounds the slices one transfer has posted on one rail;
	// default 4.
	MaxInFlight int
	// PauseAfter is how many consecutive failures pause a rail; default 2.
	PauseAfter int
	// PauseBase is the first pause of a failing rail, doubling with each
	// further failure up to PauseMax; defaults 1 s and 30 s.
	PauseBase, PauseMax time.Duration
	// QPTimeout is how long a rail may have work outstanding without any
	// progress before it is declared broken; default 10 s.
	QPTimeout time.Duration
	// DialTimeout bounds connecting a rail; default 10 s.
	DialTimeout time.Duration
	// ControlTimeout bounds the control exchange when the caller's context
	// has no deadline; default 30 s.
	ControlTimeout time.Duration
	Metrics        *Metrics
	// Clock times the rails' pauses and degraded marks (PauseBase..PauseMax,
	// Degrade's d); default the wall clock. A test passes a
	// clockwork.FakeClock and advances it past a pause instead of waiting
	// one out. Transfer and queue-pair timing stay on the wall clock.
	Clock clockwork.Clock

	growSlices bool // SliceSize was defaulted: slices grow with the transfer
}

// maxGrownSlice bounds the slices a defaulted SliceSize grows to.
const maxGrownSlice = 8 << 20

// sliceSize is the striping unit of a transfer of n bytes over rails
// rails.
func (c *Config) sliceSize(n int64, rails int) int64 {
	if !c.growSlices || rails <= 0 {
		return c.SliceSize
	}
	s := n / int64(c.MaxInFlight*rails)
	s = (s + 64<<10 - 1) &^ (64<<10 - 1) // whole 64 KiB units
	return max(c.SliceSize, min(s, maxGrownSlice))
}

func (c *Config) defaults() error {
	if err := c.Security.Defaults("rdma: Config"); err != nil {
		return err
	}
	if c.Provider == nil {
		return errors.New("rdma: Config needs a Provider")
	}
	if c.EncryptData {
		return ErrEncrypt
	}
	if c.SliceSize <= 0 {
		c.SliceSize = 512 << 10
		c.growSlices = true
	}
	c.SliceSize = min(c.SliceSize, 1<<30)
	if c.MaxInFlight <= 0 {
		c.MaxInFlight = 4
	}
	if c.PauseAfter <= 0 {
		c.PauseAfter = 2
	}
	if c.PauseBase <= 0 {
		c.PauseBase = time.Second
	}
	if c.PauseMax <= 0 {
		c.PauseMax = 30 * time.Second
	}
	if c.QPTimeout <= 0 {
		c.QPTimeout = 10 * time.Second
	}
	if c.DialTimeout <= 0 {
		c.DialTimeout = 10 * time.Second
	}
	if c.ControlTimeout <= 0 {
		c.ControlTimeout = 30 * time.Second
	}
	if c.Clock == nil {
		c.Clock = clockwork.NewRealClock()
	}
	return nil
}

// Transport is the "rdma" transport: one-sided READs (and, for push,
// WRITEs) of the owner's registered memory through a verbs provider,
// striped over every rail between the two hosts in proportion to each
// rail's measured throughput, with failed slices moved to other rails and
// failing rails paused.
type Transport struct {
	cfg  Config
	nics []*localNIC
	log  *slog.Logger
	gd   *gpuDirect

	mu      sync.Mutex
	rails   map[string]*rail
	routes  map[routeKey]route // railsFor's answers (see there)
	waiters map[uint64]chan<- Completion
	nextID  uint64
	changed chan struct{} // closed and replaced when a rail changes state
	closed  bool
	base    context.Context // cancelled by Close
	stop    context.CancelFunc
	wg      sync.WaitGroup
	// packWarned: a gathered push was packed (a warning the first time).
	packWarned atomic.Bool
}

var (
	_ fabric.Transport = (*Transport)(nil)
	_ fabric.Writer    = (*Transport)(nil)
)

type localNIC struct {
	name   string
	dev    Context
	pd     ProtectionDomain
	cq     CompletionQueue
	maxSGE int // segments per WRITE (MaxSGE(dev))
}

// New opens the local NICs and returns the transport.
func New(ctx context.Context, cfg Config) (*Transport, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	t := &Transport{cfg: cfg, log: cfg.Logger, rails: map[string]*rail{}, routes: map[routeKey]route{},
		waiters: map[uint64]chan<- Completion{}, changed: make(chan struct{})}
	t.gd = &gpuDirect{prov: cfg.Provider, log: cfg.Logger, metrics: cfg.Metrics}
	t.base, t.stop = context.WithCancel(context.Background())
	names := cfg.NICs
	if len(names) == 0 {
		for _, d := range cfg.Provider.Devices() {
			names = append(names, d.Name)
		}
	}
	if len(names) == 0 {
		return nil, fmt.Errorf("%w: provider %s has no device", ErrNoDevice, cfg.Provider.Name())
	}
	for _, name := range names {
		dev, err := cfg.Provider.Open(ctx, name, OpenConfig{Security: cfg.Security})
		if err != nil {
			t.Close()
			return nil, err
		}
		n := &localNIC{name: name, dev: dev, maxSGE: MaxSGE(dev)}
		t.nics = append(t.nics, n)
		if n.pd, err = dev.AllocPD(); err == nil {
			n.cq, err = dev.CreateCQ()
		}
		if err != nil {
			t.Close()
			return nil, err
		}
		t.wg.Add(1)
		go t.dispatch(n)
	}
	return t, nil
}

// Name returns "rdma".
func (t *Transport) Name() string { return fabric.RDMA }

// Reach serves two different hosts that both have RDMA NICs in the
// topology (any two different hosts without a topology), and the same
// host only with AllowLoopback.
func (t *Transport) Reach(src, dst fabric.Endpoint) (fabric.Cost, bool) {
	cost, ok := t.reach(src, dst)
	if ok {
		// Explain says what becomes of device memory on this path.
		cost.Reason += t.gd.note(src.Device, dst.Device)
	}
	return cost, ok
}

func (t *Transport) reach(src, dst fabric.Endpoint) (fabric.Cost, bool) {
	cost := fabric.Cost{Path: topology.Path{Class: topology.PathNET}}
	if src.Host == dst.Host {
		if !t.cfg.AllowLoopback {
			return fabric.Cost{Reason: "same host: rdma moves data between hosts (AllowLoopback is off)"}, false
		}
		cost.Path.Class = topology.PathSYS
		cost.GBps = 2 // the software provider over loopback
		cost.Reason = "same host over loopback rails (AllowLoopback)"
		cost.Stripes = len(t.nics)
		return cost, true
	}
	if t.cfg.Topology == nil {
		cost.GBps = 12.5
		cost.Reason = "different hosts (no topology: assuming RDMA NICs)"
		cost.Stripes = len(t.nics)
		return cost, true
	}
	var speeds [2]float64
	var rails [2]int
	for i, h := range []string{src.Host, dst.Host} {
		host, ok := t.cfg.Topology.Host(h)
		if !ok {
			return fabric.Cost{Reason: "host " + h + " is not in the topology"}, false
		}
		for _, n := range host.NICs {
			if n.RDMA() {
				speeds[i] += n.SpeedGbps
				rails[i]++
			}
		}
		if speeds[i] == 0 {
			return fabric.Cost{Reason: "host " + h + " has no RDMA NIC"}, false
		}
	}
	cost.GBps = min(speeds[0], speeds[1]) / 8
	cost.Stripes = min(rails[0], rails[1])
	cost.Reason = fmt.Sprintf("RDMA NICs on both hosts (%.0f Gb/s striped)", min(speeds[0], speeds[1]))
	return cost, true
}

// Read pulls src's bytes into dst.
func (t *Transport) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	if src.Length < 0 || dst.Len() < src.Length {
		return fabric.Stats{}, fmt.Errorf("%w: destination holds %d of %d bytes", tensor.ErrTooSmall, dst.Len(), src.Length)
	}
	if tensor.IsDevice(dst) {
		return t.readDevice(ctx, src, dst)
	}
	p, err := tensor.BytesOf(dst)
	if err != nil {
		return fabric.Stats{}, err
	}
	return t.transfer(ctx, src, dst.Device(), p[:src.Length], nil, false)
}

// Write pushes src's first dst.Length bytes into the sink dst names.
func (t *Transport) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	if dst.Length < 0 || src.Len() < dst.Length {
		return fabric.Stats{}, fmt.Errorf("%w: source holds %d of %d bytes", tensor.ErrTooSmall, src.Len(), dst.Length)
	}
	if tensor.IsDevice(src) {
		return t.writeDevice(ctx, src, dst)
	}
	p, err := tensor.BytesOf(src)
	if err != nil {
		return fabric.Stats{}, err
	}
	return t.transfer(ctx, dst, src.Device(), p[:dst.Length], nil, true)
}

// Close breaks every rail and stops the transport's goroutines. Transfers
// in flight fail with fabric.ErrClosed. Idempotent.
func (t *Transport) Close() error {
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil
	}
	t.closed = true
	t.stop()
	rails := t.rails
	t.rails, t.routes = map[string]*rail{}, map[routeKey]route{}
	t.broadcastLocked()
	t.mu.Unlock()
	for _, r := range rails {
		r.mu.Lock()
		qp := r.qp
		r.qp = nil
		r.mu.Unlock()
		if qp != nil {
			qp.Close()
		}
	}
	t.wg.Wait()
	var errs []error
	for _, n := range t.nics {
		errs = append(errs, n.dev.Close())
	}
	return errors.Join(errs...)
}

// dispatch routes a NIC's completions to the transfers waiting for them.
func (t *Transport) dispatch(n *localNIC) {
	defer t.wg.Done()
	ctx := t.base
	wcs := make([]Completion, 64)
	for {
		if err := n.cq.Wait(ctx); err != nil {
			return
		}
		k := n.cq.Poll(wcs)
		t.mu.Lock()
		for _, wc := range wcs[:k] {
			if ch := t.waiters[wc.ID]; ch != nil {
				delete(t.waiters, wc.ID)
				ch <- wc // buffered for every request the transfer has posted
			}
		}
		t.mu.Unlock()
	}
}

func (t *Transport) broadcastLocked() {
	close(t.changed)
	t.changed = make(chan struct{})
}

func (t *Transport) changes() <-chan struct{} {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.changed
}

// rail is one (local NIC, owner NIC) pair towards one owner, shared by
// every transfer to that owner. Its queue pair is connected on demand and
// replaced when it breaks; a rail that keeps failing is paused.
type rail struct {
	key, label string
	local      *localNIC
	remote     Rail
	peer       peer.ID

	mu          sync.Mutex
	qp          QueuePair
	connecting  bool
	ewma        float64 // bytes per second
	failures    int     // consecutive
	pausedUntil time.Time
	lastErr     error
	// degradedUntil is set by Degrade (link telemetry: the connection
	// under the rail queues or drops): the rail still works, so slices in
	// flight finish, but it gets no new slice while another rail can take
	// it.
	degradedUntil  time.Time
	degradedReason string
}

// degraded says whether the rail is marked degraded now.
func (r *rail) degraded(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return now.Before(r.degradedUntil)
}

// takesSlices says whether the rail may get a slice now without waiting
// out a pause: connected or connectable.
func (r *rail) takesSlices(now time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return !now.Before(r.pausedUntil) && (r.qp == nil || r.qp.Err() == nil)
}

const initialRate = 1e9 // bytes/s: equal shares until measured

var errPaused = errors.New("rdma: rail paused")

// routeKey is what railsFor's answer depends on: the owner, the address
// it serves rdma at, its source device and the local destination device.
type routeKey struct {
	peer, addr, host string
	srcDev, dstDev   tensor.DeviceID
}

// route is one railsFor answer.
type route struct {
	rails []*rail
	peer  peer.ID
}

// maxRoutes bounds the route cache; past it the cache starts over (a node
// talks to far fewer owner-device pairs than this).
const maxRoutes = 4096

// railsFor returns the rails towards src's owner, best first: the owner's
// NICs nearest its source device, each paired with a local NIC of the same
// name or else the local NIC nearest the destination device. The answer
// is cached per owner, address and device pair: working it out (parsing
// the address and the peer ID, ranking NICs by the topology) took a tenth
// of a broadcast's CPU in 64 KiB chunks, where every chunk asks again.
// Rails are never replaced while the transport is open, so a cached
// answer stays right until Close.
func (t *Transport) railsFor(src fabric.Remote, dstDev tensor.DeviceID) ([]*rail, peer.ID, error) {
	addr := src.Addrs[fabric.RDMA]
	if addr == "" {
		return nil, "", fmt.Errorf("%w: owner %s serves no rdma address", fabric.ErrNoPath, src.Peer)
	}
	key := routeKey{peer: src.Peer, addr: addr, host: src.Endpoint.Host, srcDev: src.Endpoint.Device, dstDev: dstDev}
	t.mu.Lock()
	r, ok := t.routes[key]
	closed := t.closed
	t.mu.Unlock()
	if closed {
		return nil, "", fabric.ErrClosed
	}
	if ok {
		return r.rails, r.peer, nil
	}
	remote, err := ParseAddrs(addr)
	if err != nil {
		return nil, "", err
	}
	want, err := peer.Decode(src.Peer)
	if err != nil {
		return nil, "", fmt.Errorf("%w: owner peer id %q: %v", fabric.ErrBadRequest, src.Peer, err)
	}
	remote = orderByTopology(t.cfg.Topology, src.Endpoint.Host, src.Endpoint.Device, remote, func(r Rail) string { return r.NIC })
	locals := orderByTopology(t.cfg.Topology, t.cfg.Host, dstDev, slices.Clone(t.nics), func(n *localNIC) string { return n.name })
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return nil, "", fabric.ErrClosed
	}
	out := make([]*rail, 0, len(remote))
	for i, rr := range remote {
		local := locals[i%len(locals)]
		for _, l := range locals {
			if l.name == rr.NIC {
				local = l
			}
		}
		railKey := want.String() + "|" + local.name + "|" + rr.Addr
		r := t.rails[railKey]
		if r == nil {
			r = &rail{key: railKey, label: local.name + "->" + rr.NIC, local: local, remote: rr, peer: want, ewma: initialRate}
			t.rails[railKey] = r
		}
		out = append(out, r)
	}
	if len(t.routes) >= maxRoutes {
		clear(t.routes)
	}
	t.routes[key] = route{rails: out, peer: want}
	return out, want, nil
}

// orderByTopology sorts NICs by closeness to a device of host (stable;
// unknown NICs last), when the topology knows the host and device.
func orderByTopology[T any](topo *topology.Cluster, host string, dev tensor.DeviceID, items []T, name func(T) string) []T {
	if topo == nil || dev.IsHost() {
		return items
	}
	h, ok := topo.Host(host)
	if !ok {
		return items
	}
	rank := map[string]int{}
	for i, n := range h.NearestNICs(dev.Index) {
		rank[n.Name], rank[n.RDMADevice] = i+1, i+1
	}
	pos := func(x T) int {
		if r := rank[name(x)]; r > 0 {
			return r
		}
		return 1 << 20
	}
	slices.SortStableFunc(items, func(a, b T) int { return pos(a) - pos(b) })
	return items
}

// ready returns the rail's queue pair if it is connected; otherwise it
// starts connecting (in the background, so one slow rail never holds the
// others) and returns nil.
func (t *Transport) ready(r *rail) (QueuePair, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.qp != nil && r.qp.Err() == nil {
		return r.qp, nil
	}
	if t.cfg.Clock.Now().Before(r.pausedUntil) {
		return nil, errPaused
	}
	if r.connecting {
		return nil, nil
	}
	t.mu.Lock()
	if t.closed {
		t.mu.Unlock()
		return nil, fabric.ErrClosed
	}
	t.wg.Add(1)
	t.mu.Unlock()
	r.connecting = true
	go t.connect(r)
	return nil, nil
}

func (t *Transport) connect(r *rail) {
	defer t.wg.Done()
	ctx, cancel := context.WithTimeout(t.base, t.cfg.DialTimeout)
	defer cancel()
	qp, err := r.local.pd.CreateQP(r.local.cq, QPConfig{MaxOutstanding: 256, Timeout: t.cfg.QPTimeout})
	if err == nil {
		err = qp.Connect(ctx, r.remote.Addr, r.peer)
		if err != nil {
			qp.Close()
		}
	}
	r.mu.Lock()
	r.connecting = false
	if err == nil {
		old := r.qp
		r.qp = qp
		r.mu.Unlock()
		if old != nil {
			old.Close()
		}
	} else {
		r.mu.Unlock()
		t.railFailed(r, nil, fmt.Errorf("connect: %w", err))
	}
	t.mu.Lock()
	if t.closed && err == nil {
		t.mu.Unlock()
		qp.Close()
		return
	}
	t.broadcastLocked()
	t.mu.Unlock()
}

// railFailed records a failure of the rail (of its queue pair qp, when
// the failure broke one: it is closed, which flushes its other requests).
// Failures of a queue pair that was already replaced are not counted
// again. Enough consecutive failures pause the rail with a doubling
// backoff; the pause is logged and counted.
func (t *Transport) railFailed(r *rail, qp QueuePair, err error) {
	r.mu.Lock()
	if qp != nil {
		if r.qp != qp {
			r.mu.Unlock()
			return
		}
		r.qp = nil
	}
	r.failures++
	r.lastErr = err
	var pause time.Duration
	if r.failures >= t.cfg.PauseAfter {
		pause = min(t.cfg.PauseBase<<min(r.failures-t.cfg.PauseAfter, 20), t.cfg.PauseMax)
		r.pausedUntil = t.cfg.Clock.Now().Add(pause)
	}
	failures := r.failures
	r.mu.Unlock()
	if qp != nil {
		qp.Close()
	}
	if pause > 0 {
		t.log.Warn("rdma rail paused", "rail", r.label, "owner", r.peer, "addr", r.remote.Addr,
			"failures", failures, "pause", pause, "err", err)
		if t.cfg.Metrics != nil {
			t.cfg.Metrics.RailPauses.WithLabelValues(r.label).Inc()
		}
	} else {
		t.log.Info("rdma rail failed, reconnecting", "rail", r.label, "owner", r.peer, "err", err)
	}
	t.mu.Lock()
	if !t.closed {
		t.broadcastLocked()
	}
	t.mu.Unlock()
}

func (r *rail) succeeded(n int, service time.Duration) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.failures = 0
	if service > 0 && n >= 64<<10 {
		sample := float64(n) / service.Seconds()
		r.ewma = 0.75*r.ewma + 0.25*sample
	}
}

// rate is the rail's measured throughput (bytes/s).
func (r *rail) rate() float64 {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ewma
}

// RailState describes one rail of the transport, for Explain-style output and
// tests.
type RailState struct {
	Label       string
	Owner       string
	Addr        string
	Connected   bool
	PausedUntil time.Time
	Failures    int
	GBps        float64 // throughput estimate
	// Degraded is set while link telemetry has the rail marked degraded
	// (Degrade): it gets no new slices while another rail can take them,
	// until Recover or DegradedUntil.
	Degraded       bool
	DegradedUntil  time.Time
	DegradedReason string
}

// Rails reports the rails the transport knows.
func (t *Transport) Rails() []RailState {
	t.mu.Lock()
	rails := make([]*rail, 0, len(t.rails))
	for _, r := range t.rails {
		rails = append(rails, r)
	}
	t.mu.Unlock()
	out := make([]RailState, 0, len(rails))
	now := t.cfg.Clock.Now()
	for _, r := range rails {
		r.mu.Lock()
		out = append(out, RailState{Label: r.label, Owner: r.peer.String(), Addr: r.remote.Addr,
			Connected: r.qp != nil && r.qp.Err() == nil, PausedUntil: r.pausedUntil, Failures: r.failures, GBps: r.ewma / 1e9,
			Degraded: now.Before(r.degradedUntil), DegradedUntil: r.degradedUntil, DegradedReason: r.degradedReason})
		r.mu.Unlock()
	}
	slices.SortFunc(out, func(a, b RailState) int {
		if a.Label < b.Label {
			return -1
		}
		if a.Label > b.Label {
			return 1
		}
		return 0
	})
	return out
}

func randomID() uint64 {
	var b [8]byte
	rand.Read(b[:])
	return binary.BigEndian.Uint64(b[:])
}

// register posts interest in a work request id.
func (t *Transport) register(ch chan<- Completion) (uint64, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return 0, false
	}
	t.nextID++
	t.waiters[t.nextID] = ch
	return t.nextID, true
}

func (t *Transport) unregister(ids ...uint64) {
	t.mu.Lock()
	for _, id := range ids {
		delete(t.waiters, id)
	}
	t.mu.Unlock()
}

// ioError classifies a failure to reach the owner.
func ioError(err error) error {
	var re *peerauth.RemoteError
	switch {
	case errors.As(err, &re), errors.Is(err, fabric.ErrPeerClosed), errors.Is(err, fabric.ErrStalled),
		errors.Is(err, fabric.ErrClosed), errors.Is(err, fabric.ErrCorrupt), errors.Is(err, fabric.ErrUnauthorized),
		errors.Is(err, fabric.ErrBadRequest), errors.Is(err, context.Canceled), errors.Is(err, context.DeadlineExceeded):
		return err
	}
	return fmt.Errorf("%w: %v", fabric.ErrPeerClosed, err)
}
