package fabric_test

import (
	"context"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// wbatcher is a BatchWriter that fails the items whose sink's first byte
// is in fails (with that error) and records its calls.
type wbatcher struct {
	fake
	fails map[byte]error

	mu    sync.Mutex
	calls [][]string // the destinations of each WriteBatch's items
	alone int        // Writes
}

func (b *wbatcher) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	b.mu.Lock()
	b.alone++
	b.mu.Unlock()
	return fabric.Stats{Transport: b.name, Bytes: dst.Length}, nil
}

func (b *wbatcher) WriteBatch(ctx context.Context, srcs []tensor.Buffer, dsts []fabric.Remote) ([]fabric.Stats, []error) {
	sts, errs := make([]fabric.Stats, len(dsts)), make([]error, len(dsts))
	var peers []string
	for i, d := range dsts {
		peers = append(peers, d.Peer)
		if err := b.fails[d.Claim.Object[0]]; err != nil {
			errs[i] = err
			continue
		}
		sts[i] = fabric.Stats{Transport: b.name, Bytes: d.Length, Coalesced: len(dsts)}
	}
	b.mu.Lock()
	b.calls = append(b.calls, peers)
	b.mu.Unlock()
	return sts, errs
}

// WriteBatch groups pushes per (transport, destination) as ReadBatch
// groups reads per owner; terminal failures stay, passing ones are pushed
// again on their own.
func TestPlannerWriteBatch(t *testing.T) {
	b := &wbatcher{fake: fake{name: fabric.TCP}, fails: map[byte]error{
		1: fabric.ErrObjectFreed, // terminal: stays failed
		2: fabric.ErrPeerClosed,  // passing: pushed again on its own
	}}
	m := fabric.NewMetrics(prometheus.NewRegistry())
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Metrics: m}, b)
	require.NoError(t, err)
	mk := func(peer string, obj byte) fabric.Remote {
		return fabric.Remote{Endpoint: fabric.Endpoint{Process: peer, Host: "h1"}, Peer: peer, Claim: fabric.Claim{Object: fabric.ObjectID{obj}}, Length: 10}
	}
	dsts := []fabric.Remote{mk("a", 0), mk("a", 1), mk("a", 2), mk("a", 0), mk("b", 0), mk("c", 0), mk("c", 0)}
	bufs := make([]tensor.Buffer, len(dsts))
	srcs := make([]fabric.Endpoint, len(dsts))
	mem := tensor.NewHostMemory(0)
	for i := range bufs {
		bufs[i], err = mem.Alloc(context.Background(), 10)
		require.NoError(t, err)
		defer bufs[i].Release()
		srcs[i] = fabric.Endpoint{Process: "w", Host: "h0"}
	}
	res := p.WriteBatch(context.Background(), srcs, bufs, dsts, 2)
	require.Len(t, res, len(dsts))
	for i, want := range []struct {
		err       error
		coalesced int
	}{
		{nil, 4}, {fabric.ErrObjectFreed, 0}, {nil, 0}, {nil, 4}, // a: coalesced; item 2 again alone
		{nil, 0},           // b: one item, pushed alone
		{nil, 2}, {nil, 2}, // c
	} {
		if want.err != nil {
			assert.ErrorIs(t, res[i].Err, want.err, "item %d", i)
			continue
		}
		require.NoError(t, res[i].Err, "item %d", i)
		assert.Equal(t, want.coalesced, res[i].Stats.Coalesced, "item %d", i)
		assert.Equal(t, fabric.TCP, res[i].Plan.Chosen, "item %d", i)
		assert.True(t, res[i].Plan.CoalescesWrites())
	}
	assert.Len(t, b.calls, 2, "one WriteBatch per destination with two items or more")
	assert.Equal(t, 2, b.alone, "b's single item and a's item that failed for a passing reason")
	assert.Equal(t, 4.0, testutil.ToFloat64(m.Coalesced.WithLabelValues(fabric.TCP)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Retries.WithLabelValues(fabric.TCP)))

	// Mismatched arguments: every item fails, nothing runs.
	for _, res := range [][]fabric.BatchResult{
		p.WriteBatch(context.Background(), srcs, bufs[:1], dsts, 0),
		p.WriteBatch(context.Background(), srcs[:1], bufs, dsts, 0),
	} {
		require.Len(t, res, len(dsts))
		for _, r := range res {
			assert.ErrorIs(t, r.Err, fabric.ErrBadRequest)
		}
	}
}

// A transport that pushes but has no batches, and one that only reads:
// the first pushes each item on its own, the second is not a push path.
func TestPlannerWriteBatchWithoutBatchWriter(t *testing.T) {
	w := &writerOnly{fake: fake{name: fabric.TCP}}
	p, err := fabric.NewPlanner(fabric.PlannerConfig{}, w)
	require.NoError(t, err)
	mem := tensor.NewHostMemory(0)
	var dsts []fabric.Remote
	var bufs []tensor.Buffer
	var srcs []fabric.Endpoint
	for range 3 {
		b, err := mem.Alloc(context.Background(), 1)
		require.NoError(t, err)
		defer b.Release()
		dsts, bufs = append(dsts, fabric.Remote{Peer: "a", Length: 1, Endpoint: fabric.Endpoint{Host: "h1"}}), append(bufs, b)
		srcs = append(srcs, fabric.Endpoint{Host: "h0"})
	}
	res := p.WriteBatch(context.Background(), srcs, bufs, dsts, 1)
	for _, r := range res {
		require.NoError(t, r.Err)
		assert.Zero(t, r.Stats.Coalesced)
		assert.False(t, r.Plan.CoalescesWrites())
	}
	assert.Equal(t, 3, w.writes)

	p, err = fabric.NewPlanner(fabric.PlannerConfig{}, &fake{name: fabric.TCP})
	require.NoError(t, err)
	for _, r := range p.WriteBatch(context.Background(), srcs, bufs, dsts, 1) {
		assert.ErrorIs(t, r.Err, fabric.ErrNoPath)
	}
}

type writerOnly struct {
	fake
	mu     sync.Mutex
	writes int
}

func (w *writerOnly) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	w.mu.Lock()
	w.writes++
	w.mu.Unlock()
	return fabric.Stats{Transport: w.name, Bytes: dst.Length}, nil
}
