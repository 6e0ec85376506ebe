package reader

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/leases"
	"github.com/tensorlane/tensorlane/rdt/internal/peers"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// The seam's contract: a fake runtime (Env), failure detector (Peers) and
// data paths (Planner) around the real lease table.

const (
	self    = peer.ID("self")
	ownerID = peer.ID("owner")
	other   = peer.ID("other")
)

// fakeEnv is a runtime whose owners answer lease requests from a table.
type fakeEnv struct {
	mu      sync.Mutex
	closed  bool
	leases  map[peer.ID]int // lease requests sent, per ownerID
	inc     map[peer.ID]uint64
	refuse  map[fabric.ObjectID]error // a claim's condition at its ownerID
	fail    map[peer.ID]error         // a lease request's error, per ownerID
	block   map[peer.ID]chan struct{} // lease requests wait on it
	pingErr error                     // the ping's answer
	pingInc uint64                    // the incarnation a ping reports
	probe   peers.ProbeOutcome        // what the probe sees
	learned map[peer.ID]int
	mem     tensor.Memory
}

func newEnv() *fakeEnv {
	return &fakeEnv{leases: map[peer.ID]int{}, inc: map[peer.ID]uint64{ownerID: 7, other: 9},
		refuse: map[fabric.ObjectID]error{}, fail: map[peer.ID]error{}, block: map[peer.ID]chan struct{}{},
		learned: map[peer.ID]int{}, probe: peers.Spoke, mem: tensor.NewHostMemory(1 << 20)}
}

func (e *fakeEnv) Self() (peer.ID, uint64) { return self, 1 }
func (e *fakeEnv) Closed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.closed
}

func (e *fakeEnv) Lease(ctx context.Context, to peer.ID, claims []fabric.Claim, _ []ctlwire.Layout) (uint64, []error, error) {
	e.mu.Lock()
	e.leases[to]++
	block, fail := e.block[to], e.fail[to]
	e.mu.Unlock()
	if block != nil {
		select {
		case <-block:
		case <-ctx.Done():
			return 0, nil, fmt.Errorf("%w: %w", errs.PeerUnreachable, ctx.Err())
		}
	}
	if fail != nil {
		return 0, nil, fail
	}
	out := make([]error, len(claims))
	e.mu.Lock()
	defer e.mu.Unlock()
	for i, c := range claims {
		out[i] = e.refuse[c.Object]
	}
	return e.inc[to], out, nil
}

func (e *fakeEnv) Ping(context.Context, peer.ID) (uint64, error) { return e.pingInc, e.pingErr }
func (e *fakeEnv) Learn(ref Ref) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.learned[ref.Owner]++
}
func (e *fakeEnv) Confirm(ref Ref) error                         { return e.refuse[ref.Object] }
func (e *fakeEnv) Memory(tensor.DeviceID) (tensor.Memory, error) { return e.mem, nil }
func (e *fakeEnv) Endpoint(dev tensor.DeviceID) fabric.Endpoint {
	return fabric.Endpoint{Process: "self/1", Host: "h", Device: dev}
}
func (e *fakeEnv) Observe(string, Ref, fabric.Endpoint) func(Result, error) {
	return func(Result, error) {}
}
func (e *fakeEnv) Probe(context.Context, []string) peers.ProbeOutcome { return e.probe }

// fakePeers is a failure detector the test declares deaths in.
type fakePeers struct {
	mu       sync.Mutex
	dead     map[peer.ID]chan struct{}
	replaced map[peer.ID]uint64
	seen     map[peer.ID]bool
	uses     int
	declared []peer.ID
}

func newPeers() *fakePeers {
	return &fakePeers{dead: map[peer.ID]chan struct{}{}, replaced: map[peer.ID]uint64{}, seen: map[peer.ID]bool{ownerID: true, other: true}}
}

func (p *fakePeers) ch(id peer.ID) chan struct{} {
	if p.dead[id] == nil {
		p.dead[id] = make(chan struct{})
	}
	return p.dead[id]
}

func (p *fakePeers) kill(id peer.ID) {
	p.mu.Lock()
	defer p.mu.Unlock()
	close(p.ch(id))
}

func (p *fakePeers) Use(peer.ID) func() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.uses++
	return func() {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.uses--
	}
}

func (p *fakePeers) DeathOf(id peer.ID, _ uint64) <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ch(id)
}

func (p *fakePeers) Replaced(id peer.ID, _ uint64) (uint64, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	inc, ok := p.replaced[id]
	return inc, ok
}

func (p *fakePeers) IsDead(id peer.ID, _ uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.ch(id):
		return true
	default:
		return false
	}
}

func (p *fakePeers) SeenAlive(id peer.ID, _ uint64) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.seen[id]
}

func (p *fakePeers) NeverAnswered(id peer.ID, inc uint64) bool { return !p.SeenAlive(id, inc) }
func (p *fakePeers) SawAlive(id peer.ID, _ uint64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seen[id] = true
}
func (p *fakePeers) DeclareDead(id peer.ID, _ string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.declared = append(p.declared, id)
}

// fakePlanner moves bytes by allocating the destination (Fetch) or
// failing with err; hold, if set, makes a read wait for ctx.
type fakePlanner struct {
	err  error
	hold bool
	warm fabric.Transport // the chosen transport, for Warm
}

func (f *fakePlanner) PlanRead(src fabric.Remote, dst fabric.Endpoint) fabric.Plan {
	return fabric.Plan{Src: src.Endpoint, Dst: dst, Chosen: "fake"}
}

func (f *fakePlanner) wait(ctx context.Context) error {
	if f.hold {
		<-ctx.Done()
		return fmt.Errorf("%w: %w", fabric.ErrPeerClosed, ctx.Err())
	}
	return f.err
}

func (f *fakePlanner) Fetch(ctx context.Context, plan *fabric.Plan, src fabric.Remote, alloc func(context.Context, int64) (tensor.Buffer, error)) (tensor.Buffer, fabric.Stats, error) {
	if err := f.wait(ctx); err != nil {
		return nil, fabric.Stats{}, err
	}
	buf, err := alloc(ctx, src.Length)
	return buf, fabric.Stats{Bytes: src.Length}, err
}

func (f *fakePlanner) Read(ctx context.Context, src fabric.Remote, dst fabric.Endpoint, _ tensor.Buffer) (fabric.Stats, fabric.Plan, error) {
	return fabric.Stats{Bytes: src.Length}, f.PlanRead(src, dst), f.wait(ctx)
}

func (f *fakePlanner) ReadBatch(ctx context.Context, srcs []fabric.Remote, dst fabric.Endpoint, _ []tensor.Buffer, _ int) []fabric.BatchResult {
	out := make([]fabric.BatchResult, len(srcs))
	err := f.wait(ctx)
	for i, s := range srcs {
		out[i] = fabric.BatchResult{Stats: fabric.Stats{Bytes: s.Length, Coalesced: len(srcs)}, Plan: f.PlanRead(s, dst), Err: err}
	}
	return out
}

func (f *fakePlanner) Transports(name string) []fabric.Transport {
	if f.warm == nil {
		return nil
	}
	return []fabric.Transport{f.warm}
}

func (f *fakePlanner) PlanView(fabric.Remote, fabric.Endpoint) fabric.Plan { return fabric.Plan{} }
func (f *fakePlanner) RunView(context.Context, *fabric.Plan, fabric.Remote) (tensor.Buffer, fabric.Stats, error) {
	return nil, fabric.Stats{}, errs.NoZeroCopy
}

type rig struct {
	env    *fakeEnv
	peers  *fakePeers
	plan   *fakePlanner
	leases *leases.Table
	died   prometheus.Counter
	r      *Reader
}

func newRig() *rig {
	g := &rig{env: newEnv(), peers: newPeers(), plan: &fakePlanner{}, died: prometheus.NewCounter(prometheus.CounterOpts{Name: "died"})}
	g.leases = leases.New(leases.Config{Leaser: leaserOf{g.env}, Self: self, Clock: clockwork.NewFakeClock(),
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Watch: g.peers.Use, Gone: func(leases.Key) {}})
	g.r = New(Deps{Env: g.env, Planner: g.plan, Peers: g.peers, Leases: g.leases,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), OwnerDied: g.died, PingWait: time.Second})
	return g
}

type leaserOf struct{ e *fakeEnv }

func (l leaserOf) Lease(ctx context.Context, to peer.ID, _ byte, claims []fabric.Claim, layouts []ctlwire.Layout) (uint64, []error, error) {
	return l.e.Lease(ctx, to, claims, layouts)
}

func ref(who peer.ID, obj uint64) Ref {
	inc := map[peer.ID]uint64{self: 1, ownerID: 7, other: 9}[who]
	return Ref{Owner: who, Incarnation: inc, Object: oid(obj), Host: "h", Desc: tensor.NewDesc(tensor.Float32, 4), Token: []byte("t")}
}

func oid(n uint64) fabric.ObjectID { return fabric.ObjectID{byte(n)} }

var me = Actor{Name: "a", Devices: []tensor.DeviceID{tensor.HostDevice}}

func TestFetch(t *testing.T) {
	for _, tc := range []struct {
		name   string
		ref    Ref
		setup  func(*rig)
		want   error // nil: the read succeeds
		leases int   // lease requests to ownerID
	}{
		{"own object", ref(self, 1), nil, nil, 0},
		{"own object refused by the table", ref(self, 2), func(g *rig) { g.env.refuse[oid(2)] = errs.ObjectFreed }, errs.ObjectFreed, 0},
		{"another runtime's object", ref(ownerID, 1), nil, nil, 1},
		{"freed at its ownerID", ref(ownerID, 2), func(g *rig) { g.env.refuse[oid(2)] = errs.ObjectFreed }, errs.ObjectFreed, 1},
		{"ownerID declared dead earlier", ref(ownerID, 1), func(g *rig) { g.peers.kill(ownerID) }, errs.OwnerDied, 0},
		{"ownerID restarted", ref(ownerID, 1), func(g *rig) { g.env.inc[ownerID] = 8 }, errs.StaleRef, 1},
		{"ownerID replaced, as the peers know", ref(ownerID, 1), func(g *rig) { g.peers.replaced[ownerID] = 8; g.peers.kill(ownerID) }, errs.StaleRef, 0},
		{"unreachable, never answered, silent listener", ref(ownerID, 1), func(g *rig) {
			g.peers.seen[ownerID] = false
			g.env.fail[ownerID] = errs.PeerUnreachable
			g.env.pingErr = errs.PeerUnreachable
			g.env.probe = peers.Silent
		}, errs.OwnerDied, 1},
		{"unreachable, never answered, nothing listening", ref(ownerID, 1), func(g *rig) {
			g.peers.seen[ownerID] = false
			g.env.fail[ownerID] = errs.PeerUnreachable
			g.env.pingErr = errs.PeerUnreachable
			g.env.probe = peers.NoConnect
		}, errs.PeerUnreachable, 1},
		{"path broke, ownerID gone", ref(ownerID, 1), func(g *rig) {
			g.plan.err = fabric.ErrPeerClosed
			g.env.pingErr = errs.PeerUnreachable
		}, errs.OwnerDied, 1},
		{"path broke, ownerID restarted", ref(ownerID, 1), func(g *rig) {
			g.plan.err = fabric.ErrPeerClosed
			g.env.pingInc = 8
		}, errs.StaleRef, 1},
		{"malformed ref", Ref{Owner: ownerID, Incarnation: 7}, nil, errs.MalformedRef, 0},
		{"device the actor may not use", ref(ownerID, 1), nil, errs.UnknownDevice, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newRig()
			if tc.setup != nil {
				tc.setup(g)
			}
			a := me
			if tc.want == errs.UnknownDevice {
				a = Actor{Name: "a"}
			}
			out, x, err := g.r.Fetch(context.Background(), a, tc.ref, tensor.HostDevice)
			if tc.want == nil {
				require.NoError(t, err)
				assert.Equal(t, int64(16), out.Buffer().Len())
				assert.Equal(t, "fake", x.Plan.Chosen)
				out.Release()
			} else {
				require.ErrorIs(t, err, tc.want)
			}
			died := 0.0
			if errors.Is(err, errs.OwnerDied) {
				died = 1
			}
			assert.Equal(t, died, testutil.ToFloat64(g.died), "a Get failed by an owner's death counts once")
			assert.Equal(t, tc.leases, g.env.leases[ownerID], "lease requests")
			assert.Zero(t, g.peers.uses, "the ownerID is watched only while the read runs")
			assert.Zero(t, g.env.mem.Stats().Used, "a failed read returns its buffer")
		})
	}
}

// TestFetchOwnerDiesMidRead: the death watch ends a read the path would
// never end, with the ownerID's death as its error.
func TestFetchOwnerDiesMidRead(t *testing.T) {
	g := newRig()
	g.plan.hold = true
	done := make(chan error)
	go func() {
		_, _, err := g.r.Fetch(context.Background(), me, ref(ownerID, 1), tensor.HostDevice)
		done <- err
	}()
	require.Eventually(t, func() bool { g.env.mu.Lock(); defer g.env.mu.Unlock(); return g.env.leases[ownerID] == 1 }, 10*time.Second, time.Millisecond)
	g.peers.kill(ownerID)
	err := <-done
	require.ErrorIs(t, err, errs.OwnerDied)
	assert.Contains(t, err.Error(), "a Get waited on it")
	assert.Equal(t, 1.0, testutil.ToFloat64(g.died), "counted once")
}

// TestLeaseRequestOwnerDies: a lease request a hung ownerID never answers
// ends with the death verdict, for a single Get and for a batch alike.
func TestLeaseRequestOwnerDies(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(fmt.Sprint("batch=", batch), func(t *testing.T) {
			g := newRig()
			g.env.block[ownerID] = make(chan struct{})
			done := make(chan error)
			go func() {
				if batch {
					done <- g.r.HoldBatch(context.Background(), "a", []Ref{ref(ownerID, 1), ref(ownerID, 2)})[1]
					return
				}
				_, _, err := g.r.Fetch(context.Background(), me, ref(ownerID, 1), tensor.HostDevice)
				done <- err
			}()
			require.Eventually(t, func() bool { g.env.mu.Lock(); defer g.env.mu.Unlock(); return g.env.leases[ownerID] == 1 }, 10*time.Second, time.Millisecond)
			g.peers.kill(ownerID)
			require.ErrorIs(t, <-done, errs.OwnerDied)
			assert.Zero(t, g.peers.uses)
		})
	}
}

func TestHoldBatch(t *testing.T) {
	g := newRig()
	g.env.refuse[oid(3)] = errs.ObjectFreed
	stale := ref(self, 5)
	stale.Incarnation = 2
	refs := []Ref{ref(ownerID, 1), ref(ownerID, 2), ref(ownerID, 3), ref(other, 1), ref(self, 4), stale, {Owner: ownerID, Incarnation: 7}}
	got := g.r.HoldBatch(context.Background(), "a", refs)
	for i, want := range []error{nil, nil, errs.ObjectFreed, nil, nil, errs.StaleRef, errs.MalformedRef} {
		if want == nil {
			assert.NoError(t, got[i], "ref %d", i)
		} else {
			assert.ErrorIs(t, got[i], want, "ref %d", i)
		}
	}
	assert.Equal(t, 1, g.env.leases[ownerID], "one lease request per ownerID")
	assert.Equal(t, 1, g.env.leases[other])
	assert.Equal(t, 3, g.leases.Len())
	// Held refs cost no round trip again, and a Get of one joins the hold.
	g.r.HoldBatch(context.Background(), "b", refs[:2])
	_, _, err := g.r.Fetch(context.Background(), me, refs[0], tensor.HostDevice)
	require.NoError(t, err)
	assert.Equal(t, 1, g.env.leases[ownerID])
}

func TestGetBatch(t *testing.T) {
	g := newRig()
	var landed int64
	var mu sync.Mutex
	refs := []Ref{ref(ownerID, 1), ref(ownerID, 2), ref(self, 3), ref(other, 1), {Owner: ownerID, Incarnation: 7}}
	items := g.r.GetBatch(context.Background(), me, refs, tensor.HostDevice, Batch{Parallel: 2, OnItem: func(n int64) { mu.Lock(); landed += n; mu.Unlock() }})
	for i, it := range items[:4] {
		require.NoError(t, it.Err, "item %d", i)
		it.Tensor.Release()
	}
	require.ErrorIs(t, items[4].Err, errs.MalformedRef)
	assert.Equal(t, 2, items[0].Result.Stats.Coalesced, "one ownerID's refs move together")
	assert.Equal(t, int64(4*16), landed)
	assert.Equal(t, 1, g.env.leases[ownerID], "one lease request per ownerID")
	assert.Zero(t, g.peers.uses)
}

func TestShutdownAbortsGets(t *testing.T) {
	g := newRig()
	g.plan.hold = true
	done := make(chan error)
	go func() {
		_, _, err := g.r.Fetch(context.Background(), me, ref(ownerID, 1), tensor.HostDevice)
		done <- err
	}()
	require.Eventually(t, func() bool { g.env.mu.Lock(); defer g.env.mu.Unlock(); return g.env.leases[ownerID] == 1 }, 10*time.Second, time.Millisecond)
	drained := g.r.Close()
	_, _, err := g.r.Fetch(context.Background(), me, ref(ownerID, 1), tensor.HostDevice)
	require.ErrorIs(t, err, errs.Closed, "no Get begins after Close")
	assert.Equal(t, 1, g.r.Abort(errs.Closed))
	require.ErrorIs(t, <-done, errs.Closed)
	<-drained
}

func TestHandle(t *testing.T) {
	release := make(chan struct{})
	h := Start(context.Background(), func(ctx context.Context) (int, error) {
		<-release
		return 42, nil
	}, func(finished bool, res int, _ error) Progress {
		if finished {
			return Progress{Done: int64(res), Total: 42}
		}
		return Progress{Total: 42}
	})
	assert.Equal(t, Progress{Total: 42}, h.Progress())
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err := h.Await(ctx)
	require.ErrorIs(t, err, context.Canceled, "Await's context bounds only the wait")
	close(release)
	v, err := h.Await(context.Background())
	require.NoError(t, err)
	assert.Equal(t, 42, v)
	assert.Equal(t, Progress{Done: 42, Total: 42}, h.Progress())

	c := Start(context.Background(), func(ctx context.Context) (int, error) {
		<-ctx.Done()
		return 0, ctx.Err()
	}, nil)
	c.Cancel()
	c.Cancel()
	_, err = c.Await(context.Background())
	require.ErrorIs(t, err, context.Canceled)
	assert.Equal(t, Progress{}, c.Progress())
}

// warmTransport is a transport that keeps connections.
type warmTransport struct {
	fabric.Transport
	dialed []fabric.Remote
}

func (w *warmTransport) Preconnect(_ context.Context, r fabric.Remote) error {
	w.dialed = append(w.dialed, r)
	return nil
}

func TestWarm(t *testing.T) {
	g := newRig()
	require.NoError(t, g.r.Warm(context.Background(), me, ref(ownerID, 1), tensor.HostDevice), "no transport keeps connections")
	w := &warmTransport{}
	g.plan.warm = w
	require.NoError(t, g.r.Warm(context.Background(), me, ref(ownerID, 1), tensor.HostDevice))
	require.Len(t, w.dialed, 1)
	assert.Equal(t, Remote(ref(ownerID, 1)), w.dialed[0])
	assert.Zero(t, g.env.leases[ownerID], "Warm takes no lease")
	require.ErrorIs(t, g.r.Warm(context.Background(), Actor{Name: "a"}, ref(ownerID, 1), tensor.HostDevice), errs.UnknownDevice)
	require.ErrorIs(t, g.r.Warm(context.Background(), me, Ref{Owner: ownerID}, tensor.HostDevice), errs.MalformedRef)
}

func TestExplain(t *testing.T) {
	g := newRig()
	for _, tc := range []struct {
		name string
		a    Actor
		ref  Ref
		want error
	}{
		{"runs", me, ref(ownerID, 1), nil},
		{"device the actor may not use", Actor{Name: "a"}, ref(ownerID, 1), errs.UnknownDevice},
		{"malformed ref", me, Ref{Owner: ownerID}, errs.MalformedRef},
	} {
		t.Run(tc.name, func(t *testing.T) {
			plan := g.r.Explain(tc.a, tc.ref, tensor.HostDevice)
			if tc.want == nil {
				require.NoError(t, plan.Err)
				assert.Equal(t, "fake", plan.Chosen, "the plan Fetch runs")
				return
			}
			require.ErrorIs(t, plan.Err, tc.want)
			assert.Empty(t, plan.Chosen)
		})
	}
}

func TestCount(t *testing.T) {
	release := make(chan struct{})
	h := Count(context.Background(), 10, func(ctx context.Context, landed func(int64)) (int, error) {
		landed(4)
		<-release
		landed(6)
		return 1, nil
	})
	require.Eventually(t, func() bool { return h.Progress() == Progress{Done: 4, Total: 10} }, 10*time.Second, time.Millisecond)
	close(release)
	_, err := h.Await(context.Background())
	require.NoError(t, err)
	assert.Equal(t, Progress{Done: 10, Total: 10}, h.Progress())
}

// ExplainBatch groups by owner and path: this runtime's own refs as such,
// refused reads counted apart.
func TestExplainBatch(t *testing.T) {
	g := newRig()
	refs := []Ref{ref(ownerID, 1), ref(ownerID, 2), ref(other, 1), ref(self, 3), {Owner: ownerID}}
	b := g.r.ExplainBatch(me, refs, tensor.HostDevice)
	groups := b.Done()
	require.Len(t, groups, 3)
	assert.Equal(t, 1, b.Refused)
	byOwner := map[string]int{}
	for _, gr := range groups {
		byOwner[gr.Owner] = gr.Refs
	}
	assert.Equal(t, 2, byOwner[refwire.ShortID(ownerID)])
	assert.Equal(t, 1, byOwner[refwire.ShortID(other)])
	assert.Equal(t, 1, byOwner[refwire.ShortID(self)])
	assert.Zero(t, g.env.leases[ownerID], "explaining takes no lease")
}
