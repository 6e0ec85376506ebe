package rdt

import (
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

func TestGetBatchMixed(t *testing.T) {
	ctx := context.Background()
	rts := cluster(t, nil, nil)
	owner, _ := rts[0].Spawn("trainer")
	reader, _ := rts[1].Spawn("worker")
	var refs []Ref
	var want []tensor.Tensor
	for i := range 40 {
		x := fill(t, rts[0], tensor.GPUDevice(0), tensor.BFloat16, int64(1+i%7), 1024)
		ref, err := owner.Put(ctx, x)
		require.NoError(t, err)
		refs = append(refs, ref)
		want = append(want, x)
	}
	// Two freed refs and one forged one among them.
	require.NoError(t, owner.Free(ctx, refs[3]))
	require.NoError(t, owner.Free(ctx, refs[17]))
	forged := refs[5]
	forged.Token = []byte("not the token")
	refs = append(refs, forged)

	h := reader.GetBatchAsync(ctx, refs, tensor.GPUDevice(1), BatchConfig{})
	items, err := h.Await(ctx)
	require.NoError(t, err)
	defer ReleaseBatch(items)
	for i, it := range items {
		switch i {
		case 3, 17:
			assert.ErrorIs(t, it.Err, ErrObjectFreed, "item %d", i)
		case 40:
			assert.ErrorIs(t, it.Err, ErrUnauthorized, "item %d", i)
		default:
			require.NoError(t, it.Err, "item %d", i)
			sameBytes(t, want[i], it.Tensor)
		}
	}
	p := h.Progress()
	var total int64
	for _, r := range refs {
		total += spanBytes(r.Desc)
	}
	assert.Equal(t, total, p.Total)
	assert.Equal(t, total-spanBytes(refs[3].Desc)-spanBytes(refs[17].Desc)-spanBytes(forged.Desc), p.Done)
	assert.Equal(t, 38, rts[1].holdCount(), "one hold per valid ref")
}

func TestGetAsync(t *testing.T) {
	ctx := context.Background()
	rts := cluster(t, nil, nil)
	owner, _ := rts[0].Spawn("trainer")
	reader, _ := rts[1].Spawn("worker")
	x := fill(t, rts[0], tensor.GPUDevice(0), tensor.Float32, 256, 1024)
	ref, err := owner.Put(ctx, x)
	require.NoError(t, err)
	h := reader.GetAsync(ctx, ref, tensor.GPUDevice(0))
	got, err := h.Await(ctx)
	require.NoError(t, err)
	defer got.Release()
	sameBytes(t, x, got)
	assert.Equal(t, Progress{Done: 1 << 20, Total: 1 << 20}, h.Progress())
	<-h.Done()

	// Cancelled before it could run.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	_, err = reader.GetAsync(cctx, ref, tensor.GPUDevice(0)).Await(ctx)
	assert.ErrorIs(t, err, context.Canceled)
}

func TestPushBatchAndGenerations(t *testing.T) {
	ctx := context.Background()
	rts := cluster(t, nil, nil)
	owner, _ := rts[0].Spawn("trainer")
	reader, _ := rts[1].Spawn("worker")
	var srcs, dsts []Ref
	var slots []*Slot
	for range 6 {
		x := fill(t, rts[0], tensor.GPUDevice(0), tensor.Uint8, 64<<10)
		ref, err := owner.Put(ctx, x)
		require.NoError(t, err)
		s, err := reader.Reserve(ctx, ref.Desc, tensor.GPUDevice(0), WithGenerations())
		require.NoError(t, err)
		defer s.Close()
		srcs, dsts, slots = append(srcs, ref), append(dsts, s.Ref()), append(slots, s)
	}
	_, errs := owner.PushBatch(ctx, srcs, dsts, BatchConfig{})
	for i, err := range errs {
		require.NoError(t, err, "push %d", i)
		cur, done := slots[i].Generation()
		assert.Equal(t, [2]uint64{1, 0}, [2]uint64{cur, done})
	}
	// Not done yet: the next push is refused, not written over.
	_, err := owner.Push(ctx, srcs[0], dsts[0])
	assert.Error(t, err)
	require.NoError(t, slots[0].Done(ctx, 1))
	require.NoError(t, owner.WaitConsumed(ctx, dsts[0], 1))
	_, err = owner.Push(ctx, srcs[0], dsts[0])
	require.NoError(t, err)
	assert.Error(t, slots[0].Done(ctx, 5), "a generation the slot never had")
	_, errs = owner.PushBatch(ctx, srcs[:1], dsts, BatchConfig{})
	assert.ErrorIs(t, errs[0], ErrMalformedRef)
}
