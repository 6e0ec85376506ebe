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

// batcher is a BatchReader that fails the items whose object's first byte
// is in fails (with that error) and records its calls.
type batcher struct {
	fake
	fails map[byte]error

	mu    sync.Mutex
	calls [][]string // the owners of each ReadBatch's items
	alone int        // Reads
}

func (b *batcher) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	b.mu.Lock()
	b.alone++
	b.mu.Unlock()
	return fabric.Stats{Transport: b.name, Bytes: src.Length}, nil
}

func (b *batcher) ReadBatch(ctx context.Context, srcs []fabric.Remote, dsts []tensor.Buffer) ([]fabric.Stats, []error) {
	sts, errs := make([]fabric.Stats, len(srcs)), make([]error, len(srcs))
	var owners []string
	for i, s := range srcs {
		owners = append(owners, s.Peer)
		if err := b.fails[s.Claim.Object[0]]; err != nil {
			errs[i] = err
			continue
		}
		sts[i] = fabric.Stats{Transport: b.name, Bytes: s.Length, Coalesced: len(srcs)}
	}
	b.mu.Lock()
	b.calls = append(b.calls, owners)
	b.mu.Unlock()
	return sts, errs
}

func TestPlannerReadBatch(t *testing.T) {
	b := &batcher{fake: fake{name: fabric.TCP}, fails: map[byte]error{
		1: fabric.ErrObjectFreed, // terminal: stays failed
		2: fabric.ErrPeerClosed,  // passing: read again on its own
	}}
	m := fabric.NewMetrics(prometheus.NewRegistry())
	p, err := fabric.NewPlanner(fabric.PlannerConfig{Metrics: m}, b)
	require.NoError(t, err)
	dst := fabric.Endpoint{Process: "r", Host: "h1"}
	mk := func(peer string, obj byte) fabric.Remote {
		return fabric.Remote{Endpoint: fabric.Endpoint{Process: peer, Host: "h0"}, Peer: peer, Claim: fabric.Claim{Object: fabric.ObjectID{obj}}, Length: 10}
	}
	srcs := []fabric.Remote{mk("a", 0), mk("a", 1), mk("a", 2), mk("a", 0), mk("b", 0), mk("c", 0), mk("c", 0)}
	bufs := make([]tensor.Buffer, len(srcs))
	mem := tensor.NewHostMemory(0)
	for i := range bufs {
		bufs[i], err = mem.Alloc(context.Background(), 10)
		require.NoError(t, err)
		defer bufs[i].Release()
	}
	res := p.ReadBatch(context.Background(), srcs, dst, bufs, 2)
	require.Len(t, res, len(srcs))
	for i, want := range []struct {
		err       error
		coalesced int
	}{
		{nil, 4}, {fabric.ErrObjectFreed, 0}, {nil, 0}, {nil, 4}, // a: coalesced; item 2 again alone
		{nil, 0},           // b: one item, read alone
		{nil, 2}, {nil, 2}, // c
	} {
		if want.err != nil {
			assert.ErrorIs(t, res[i].Err, want.err, "item %d", i)
			continue
		}
		require.NoError(t, res[i].Err, "item %d", i)
		assert.Equal(t, want.coalesced, res[i].Stats.Coalesced, "item %d", i)
		assert.Equal(t, fabric.TCP, res[i].Plan.Chosen, "item %d", i)
		assert.True(t, res[i].Plan.Coalesces())
	}
	assert.Len(t, b.calls, 2, "one ReadBatch per owner with two items or more")
	assert.Equal(t, 2, b.alone, "b's single item and a's item that failed for a passing reason")
	assert.Equal(t, 4.0, testutil.ToFloat64(m.Coalesced.WithLabelValues(fabric.TCP)))
	assert.Equal(t, 1.0, testutil.ToFloat64(m.Retries.WithLabelValues(fabric.TCP)))

	// Mismatched arguments: every item fails, nothing runs.
	res = p.ReadBatch(context.Background(), srcs, dst, bufs[:1], 0)
	for _, r := range res {
		assert.ErrorIs(t, r.Err, fabric.ErrBadRequest)
	}
}

// A transport without batches reads each item on its own.
func TestPlannerReadBatchWithoutBatchReader(t *testing.T) {
	f := &fake{name: fabric.TCP}
	p, err := fabric.NewPlanner(fabric.PlannerConfig{}, f)
	require.NoError(t, err)
	mem := tensor.NewHostMemory(0)
	var srcs []fabric.Remote
	var bufs []tensor.Buffer
	for range 3 {
		b, err := mem.Alloc(context.Background(), 1)
		require.NoError(t, err)
		defer b.Release()
		srcs, bufs = append(srcs, fabric.Remote{Peer: "a", Length: 1}), append(bufs, b)
	}
	res := p.ReadBatch(context.Background(), srcs, fabric.Endpoint{Host: "h1"}, bufs, 1)
	for _, r := range res {
		require.NoError(t, r.Err)
		assert.Zero(t, r.Stats.Coalesced)
		assert.False(t, r.Plan.Coalesces())
	}
	assert.Equal(t, 3, f.reads)
}
