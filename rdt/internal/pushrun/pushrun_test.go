package pushrun

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

type buf struct {
	n        int64
	released *atomic.Int64
}

func (b buf) Device() tensor.DeviceID { return tensor.HostDevice }
func (b buf) Len() int64              { return b.n }
func (b buf) Release() error          { b.released.Add(1); return nil }

// env records what the engine asks of its runtime; opening slot 7 fails.
type env struct {
	released atomic.Int64
	mu       sync.Mutex
	notices  map[peer.ID][]int // items per notice, per slot runtime
	one      []ctlwire.PushNotice
}

func (e *env) Self() (peer.ID, uint64) { return "me", 1 }
func (e *env) Open(_ context.Context, src, dst refwire.Ref, _ []fabric.Run) (tensor.Buffer, tensor.Buffer, fabric.Remote, error) {
	if dst.Object == (fabric.ObjectID{7}) {
		return nil, nil, fabric.Remote{}, errs.ObjectFreed
	}
	b := buf{n: 8, released: &e.released}
	return b, b, fabric.Remote{}, nil
}
func (e *env) Endpoint(tensor.DeviceID) fabric.Endpoint { return fabric.Endpoint{} }
func (e *env) Write(_ context.Context, _ fabric.Endpoint, b tensor.Buffer, _ fabric.Remote) (fabric.Stats, fabric.Plan, error) {
	return fabric.Stats{Bytes: b.Len()}, fabric.Plan{Chosen: "fake"}, nil
}
func (e *env) WriteRuns(_ context.Context, _ fabric.Endpoint, _ tensor.Buffer, runs []fabric.Run, _ fabric.Remote) (fabric.Stats, fabric.Plan, error) {
	return fabric.Stats{Bytes: fabric.RunsBytes(runs)}, fabric.Plan{Chosen: "fake"}, nil
}
func (e *env) Notify(_ context.Context, dst refwire.Ref, n ctlwire.PushNotice) error {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.notices[dst.Owner] = append(e.notices[dst.Owner], 1)
	e.one = append(e.one, n)
	return nil
}
func (e *env) WriteBatch(_ context.Context, eps []fabric.Endpoint, _ []tensor.Buffer, _ []fabric.Remote, _ int) []fabric.BatchResult {
	return make([]fabric.BatchResult, len(eps))
}
func (e *env) Tell(_ context.Context, to peer.ID, _ refwire.Ref, n ctlwire.PushBatchNotice) []error {
	e.mu.Lock()
	e.notices[to] = append(e.notices[to], len(n.Items))
	e.mu.Unlock()
	return make([]error, len(n.Items))
}

func TestBatch(t *testing.T) {
	e := &env{notices: map[peer.ID][]int{}}
	desc := tensor.NewDesc(tensor.Uint8, 8)
	var srcs, dsts []refwire.Ref
	add := func(owner peer.ID, inc uint64, slot byte, n int) {
		for range n {
			srcs = append(srcs, refwire.Ref{Owner: "me", Incarnation: 1, Desc: desc})
			id := fabric.ObjectID{slot, byte(len(dsts)), byte(len(dsts) >> 8)}
			dsts = append(dsts, refwire.Ref{Owner: owner, Incarnation: inc, Object: id, Desc: desc})
		}
	}
	add("a", 2, 1, ctlwire.MaxPushBatch+3) // two notices to a
	add("b", 5, 2, 2)                      // one to b
	srcs = append(srcs, refwire.Ref{Owner: "someone else", Incarnation: 1, Desc: desc})
	dsts = append(dsts, refwire.Ref{Owner: "b", Object: fabric.ObjectID{3}, Desc: desc})
	srcs = append(srcs, srcs[0])
	dsts = append(dsts, dsts[0]) // the same slot twice
	srcs = append(srcs, srcs[0])
	dsts = append(dsts, refwire.Ref{Owner: "b", Object: fabric.ObjectID{7}, Desc: desc})
	var bytes atomic.Int64
	xs, out := Batch(context.Background(), e, srcs, dsts, 4, func(n int64) { bytes.Add(n) })
	n := len(srcs)
	require.Len(t, out, n)
	for i := range n - 3 {
		require.NoError(t, out[i], i)
	}
	assert.ErrorIs(t, out[n-3], errs.NotOwner)
	assert.ErrorIs(t, out[n-2], errs.MalformedRef)
	assert.ErrorIs(t, out[n-1], errs.ObjectFreed)
	assert.Equal(t, []int{ctlwire.MaxPushBatch, 3}, e.notices["a"])
	assert.Equal(t, []int{2}, e.notices["b"])
	assert.Equal(t, ctlwire.MaxPushBatch, xs[0].Notified)
	assert.Equal(t, 3, xs[ctlwire.MaxPushBatch].Notified)
	assert.Equal(t, 2, xs[ctlwire.MaxPushBatch+3].Notified)
	assert.Equal(t, int64(n-3), e.released.Load(), "every pin released")
	assert.Equal(t, int64(8*(n-3)), bytes.Load())
}

// One opens, writes (its runs, when it has them), releases its pin and
// tells the slot's runtime; a push that cannot open tells nobody.
func TestOne(t *testing.T) {
	for _, tc := range []struct {
		name    string
		src     refwire.Ref
		slot    fabric.ObjectID
		runs    []fabric.Run
		want    error
		notices int
		bytes   int64
	}{
		{"pushed", refwire.Ref{Owner: "me", Incarnation: 1}, fabric.ObjectID{1}, nil, nil, 1, 8},
		{"runs: the notice counts their bytes", refwire.Ref{Owner: "me", Incarnation: 1}, fabric.ObjectID{1}, []fabric.Run{{Off: 0, Len: 2}, {Off: 4, Len: 3}}, nil, 1, 5},
		{"slot gone", refwire.Ref{Owner: "me", Incarnation: 1}, fabric.ObjectID{7}, nil, errs.ObjectFreed, 0, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := &env{notices: map[peer.ID][]int{}}
			dst := refwire.Ref{Owner: "b", Incarnation: 5, Object: tc.slot, Token: []byte("t")}
			x, err := One(context.Background(), e, tc.src, dst, tc.runs)
			if tc.want != nil {
				require.ErrorIs(t, err, tc.want)
				assert.Empty(t, e.one)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, "fake", x.Plan.Chosen)
			require.Len(t, e.one, tc.notices)
			assert.Equal(t, ctlwire.PushNotice{Slot: tc.slot, Incarnation: 5, Token: []byte("t"), Bytes: tc.bytes}, e.one[0])
			assert.Equal(t, int64(1), e.released.Load(), "the pin is released")
		})
	}
}
