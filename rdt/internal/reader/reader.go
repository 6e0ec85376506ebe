// Package reader is rdt's read side: the single and batch Get, GetInto,
// View and Hold paths, the death watch that ends them when the owner dies,
// the error that says why a read failed, the Gets in flight that Shutdown
// drains, the zero-copy views a runtime holds, Warm, the plans Explain
// and ExplainBatch show (the ones the reads run), and the async handles. A
// read of another runtime's object takes a lease on it first (one request
// per owner for a batch), watches the owner while it runs, moves the bytes
// with the planner and, on failure, asks the owner whether it is gone or
// only the path.
//
// What it needs of the runtime is small: Env (the lifecycle protocol's
// lease and ping, device memory, where devices sit), Planner (the data
// paths) and Peers (the failure detector); rdt's Runtime provides them in
// one place (rdt/reader.go). The lease table (leases.Table) is shared with
// the runtime, which renews and releases the leases the reader takes.
package reader

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/leases"
	"github.com/tensorlane/tensorlane/rdt/internal/peers"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Ref is a ref as the engine names it: rdt.Ref's fields.
type Ref = refwire.Ref

// Env is the runtime as its reads see it.
type Env interface {
	// Self is this runtime's peer and incarnation.
	Self() (peer.ID, uint64)
	// Closed says the runtime is shutting down.
	Closed() bool
	// Lease asks owner for a lease on claims (ctlwire.LifeLease), each
	// with the layout the reader expects, and returns the incarnation
	// that answered and each claim's condition (nil: granted).
	Lease(ctx context.Context, owner peer.ID, claims []fabric.Claim, layouts []ctlwire.Layout) (uint64, []error, error)
	// Ping asks owner for its incarnation on the control channel, past
	// any dial backoff.
	Ping(ctx context.Context, owner peer.ID) (uint64, error)
	// Learn remembers a ref's control addresses, to reach its owner.
	Learn(ref Ref)
	// Confirm checks a ref this runtime owns against its object table.
	Confirm(ref Ref) error
	// Memory is device dev's memory; Endpoint is where dev sits.
	Memory(dev tensor.DeviceID) (tensor.Memory, error)
	Endpoint(dev tensor.DeviceID) fabric.Endpoint
	// Observe records a read by actor of ref onto dst as it starts and
	// returns what records its end.
	Observe(actor string, ref Ref, dst fabric.Endpoint) func(Result, error)
	// Probe tells a frozen owner (a listener that accepts and never
	// speaks) from an unreachable one: peers.Probe at addrs.
	Probe(ctx context.Context, addrs []string) peers.ProbeOutcome
}

// Planner moves the bytes (fabric.Planner).
type Planner interface {
	PlanRead(src fabric.Remote, dst fabric.Endpoint) fabric.Plan
	Fetch(ctx context.Context, plan *fabric.Plan, src fabric.Remote, alloc func(ctx context.Context, n int64) (tensor.Buffer, error)) (tensor.Buffer, fabric.Stats, error)
	Read(ctx context.Context, src fabric.Remote, dst fabric.Endpoint, buf tensor.Buffer) (fabric.Stats, fabric.Plan, error)
	ReadBatch(ctx context.Context, srcs []fabric.Remote, dst fabric.Endpoint, bufs []tensor.Buffer, parallel int) []fabric.BatchResult
	PlanView(src fabric.Remote, dst fabric.Endpoint) fabric.Plan
	RunView(ctx context.Context, plan *fabric.Plan, src fabric.Remote) (tensor.Buffer, fabric.Stats, error)
	// Transports are the transports that go by name (Warm asks them).
	Transports(name string) []fabric.Transport
}

// Peers is the failure detector (peers.Table) as reads use it.
type Peers interface {
	// Use keeps id watched until the returned func is called.
	Use(id peer.ID) func()
	// DeathOf is closed when incarnation inc of id is declared dead.
	DeathOf(id peer.ID, inc uint64) <-chan struct{}
	// Replaced reports the newer incarnation of id this runtime knows.
	Replaced(id peer.ID, inc uint64) (uint64, bool)
	IsDead(id peer.ID, inc uint64) bool
	SeenAlive(id peer.ID, inc uint64) bool
	NeverAnswered(id peer.ID, inc uint64) bool
	SawAlive(id peer.ID, inc uint64)
	DeclareDead(id peer.ID, reason string)
}

var _ Peers = (*peers.Table)(nil)

// Deps is what a Reader is built from.
type Deps struct {
	Env     Env
	Planner Planner
	Peers   Peers
	Leases  *leases.Table // the leases this runtime holds as a reader
	Log     *slog.Logger
	// OwnerDied counts reads that failed with errs.OwnerDied.
	OwnerDied prometheus.Counter
	// PingWait bounds the ping that tells a dead owner from a broken path
	// (a heartbeat interval).
	PingWait time.Duration
}

// Result is how a read was served (rdt.Transfer).
type Result struct {
	Plan  fabric.Plan
	Stats fabric.Stats
}

// Actor is the reader of a read: its name (for the transfer records) and
// the devices it may read onto.
type Actor struct {
	Name    string
	Devices []tensor.DeviceID
}

// MayUse says whether the actor may read onto dev.
func (a Actor) MayUse(dev tensor.DeviceID) error {
	if !slices.Contains(a.Devices, dev) {
		return fmt.Errorf("%w: actor %q may use %v, not %v", errs.UnknownDevice, a.Name, a.Devices, dev)
	}
	return nil
}

// Reader is one runtime's read side.
type Reader struct {
	d     Deps
	env   Env
	views views

	mu     sync.Mutex
	closed bool
	gets   map[*int]context.CancelCauseFunc // Gets in flight, for Shutdown
	getsWG sync.WaitGroup
}

// New makes a runtime's read side.
func New(d Deps) *Reader {
	return &Reader{d: d, env: d.Env, gets: map[*int]context.CancelCauseFunc{}}
}

// Remote is where a read of ref finds its bytes.
func Remote(ref Ref) fabric.Remote {
	off, n := ref.Span()
	return fabric.Remote{
		Endpoint: fabric.Endpoint{Process: refwire.PeerString(ref.Owner) + "/" + strconv.FormatUint(ref.Incarnation, 16), Host: ref.Host, Device: ref.Device},
		Peer:     refwire.PeerString(ref.Owner),
		Addrs:    ref.DataAddrs,
		Claim:    claim(ref),
		Offset:   off,
		Length:   n,
		DType:    ref.Desc.DType,
	}
}

func claim(ref Ref) fabric.Claim {
	return fabric.Claim{Object: ref.Object, Incarnation: ref.Incarnation, Token: ref.Token}
}

// Bytes is the size of the tensor a descriptor describes.
func Bytes(d tensor.Desc) int64 {
	start, end := d.Span()
	return end - start
}

// own reports whether this runtime owns ref.
func (r *Reader) own(ref Ref) bool {
	self, _ := r.env.Self()
	return ref.Owner == self
}

// Begin registers a Get in flight so Shutdown can wait for it or abort
// it; ctx's cause says which. end unregisters it.
func (r *Reader) Begin(ctx context.Context) (_ context.Context, end func(), _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, nil, errs.Closed
	}
	ctx, cancel := context.WithCancelCause(ctx)
	key := new(int)
	r.gets[key] = cancel
	r.getsWG.Add(1)
	return ctx, func() {
		r.mu.Lock()
		delete(r.gets, key)
		r.mu.Unlock()
		cancel(nil)
		r.getsWG.Done()
	}, nil
}

// Close refuses new Gets (Begin fails with errs.Closed) and returns a
// channel closed when none is in flight any more. Shutdown calls it once.
func (r *Reader) Close() <-chan struct{} {
	r.mu.Lock()
	r.closed = true
	r.mu.Unlock()
	ch := make(chan struct{})
	go func() { r.getsWG.Wait(); close(ch) }()
	return ch
}

// Abort cancels every Get in flight with cause and says how many.
func (r *Reader) Abort(cause error) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, cancel := range r.gets {
		cancel(cause)
	}
	return len(r.gets)
}
