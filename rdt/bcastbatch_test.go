package rdt

import (
	"bytes"
	"context"
	"crypto/rand"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/tensor"
)

// stateDict puts tensors of the given sizes (bytes, uint8) on the fleet's
// owner and returns their refs and contents.
func stateDict(t *testing.T, f *fleet, sizes ...int64) ([]Ref, [][]byte) {
	t.Helper()
	ctx := context.Background()
	mem, err := f.rts[0].Memory(tensor.GPUDevice(0))
	require.NoError(t, err)
	var refs []Ref
	var data [][]byte
	for _, n := range sizes {
		x, err := tensor.Alloc(ctx, mem, tensor.Uint8, n)
		require.NoError(t, err)
		b, err := x.SpanBytes()
		require.NoError(t, err)
		rand.Read(b)
		ref, err := f.owner.Put(ctx, x)
		require.NoError(t, err)
		refs = append(refs, ref)
		data = append(data, b)
	}
	return refs, data
}

// reserveDict reserves, on every reader of the fleet (one per runtime),
// a slot per tensor of srcs, on one device.
func reserveDict(t *testing.T, f *fleet, srcs []Ref, opts ...SlotOption) (slots [][]*Slot, refs [][]Ref) {
	t.Helper()
	for i, a := range f.readers {
		var ss []*Slot
		var rs []Ref
		for _, src := range srcs {
			s, err := a.Reserve(context.Background(), src.Desc, tensor.GPUDevice(2+i%2), opts...)
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			ss = append(ss, s)
			rs = append(rs, s.Ref())
		}
		slots, refs = append(slots, ss), append(refs, rs)
	}
	return slots, refs
}

// A state dict of mixed sizes flows along one tree, one prepare per
// reader for the whole set; a freed tensor is left out and says so; every
// slot of every reader holds its tensor's bytes.
func TestBroadcastBatch(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 1024, 1)
	srcs, data := stateDict(t, f, 3<<20+17, 1000, 700<<10, 64, 2<<20, 5)
	require.NoError(t, f.owner.Free(ctx, srcs[4]))
	slots, refs := reserveDict(t, f, srcs, WithGenerations())
	var before int64
	for _, r := range f.rts {
		before += r.relays.Prepares.Load()
	}
	res, err := f.owner.BroadcastBatch(ctx, srcs, refs, BroadcastConfig{ChunkSize: 256 << 10})
	require.NoError(t, err)
	t.Logf("\n%s", res)
	require.NoError(t, res.Err())
	for k, e := range res.Items {
		if k == 4 {
			assert.ErrorIs(t, e, ErrObjectFreed, "the freed tensor")
		} else {
			assert.NoError(t, e, "tensor %d", k)
		}
	}
	var after int64
	for _, r := range f.rts {
		after += r.relays.Prepares.Load()
	}
	assert.Equal(t, int64(len(f.readers)), after-before, "one setup round per reader for the whole batch")
	assert.Equal(t, int64(3<<20+17+1000+700<<10+64+5), res.Bytes)
	for j, rr := range res.Readers {
		require.Len(t, rr.Generations, len(srcs))
		for k, s := range slots[j] {
			if k == 4 {
				assert.Zero(t, rr.Generations[k])
				assert.Zero(t, s.Pushes(), "the freed tensor's slot was not written")
				continue
			}
			assert.Equal(t, uint64(1), rr.Generations[k])
			assert.Equal(t, uint64(1), checkSlot(t, s, 0, data[k]), "reader %d tensor %d", j, k)
		}
	}
	// The step's end: every reader done with every tensor.
	for j := range slots {
		for k, s := range slots[j] {
			if k != 4 {
				require.NoError(t, s.Done(ctx, 1))
			}
		}
	}
	require.NoError(t, res.WaitConsumed(ctx))

	// Step 2 with one reader's slot closed: that reader gets none of it,
	// the others all of it.
	data[0][0] ^= 0xff
	require.NoError(t, slots[2][1].Close())
	live := append(append([]Ref(nil), srcs[:4]...), srcs[5])
	var refs2 [][]Ref
	for j := range refs {
		refs2 = append(refs2, append(append([]Ref(nil), refs[j][:4]...), refs[j][5]))
	}
	res2, err := f.owner.BroadcastBatch(ctx, live, refs2, BroadcastConfig{ChunkSize: 256 << 10})
	require.NoError(t, err)
	assert.ErrorIs(t, res2.Readers[2].Err, ErrObjectNotFound)
	assert.Equal(t, len(f.readers)-1, res2.OK(), "%v", res2.Err())
	for j := range slots {
		if j == 2 {
			assert.Equal(t, uint64(1), slots[j][0].Pushes(), "reader 2 kept step 1")
			continue
		}
		assert.Equal(t, uint64(2), checkSlot(t, slots[j][0], 1, data[0]))
		assert.True(t, bytes.Equal(mustBytes(t, slots[j][5]), data[5]))
	}
}

func mustBytes(t *testing.T, s *Slot) []byte {
	t.Helper()
	_, x, err := s.Wait(context.Background(), 0)
	require.NoError(t, err)
	b, err := x.SpanBytes()
	require.NoError(t, err)
	return b
}

// Bad batches fail whole and at once.
func TestBroadcastBatchBad(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 1024, 1)
	srcs, _ := stateDict(t, f, 1000, 2000)
	_, refs := reserveDict(t, f, srcs)
	_, err := f.owner.BroadcastBatch(ctx, srcs, [][]Ref{refs[0][:1]}, BroadcastConfig{})
	assert.ErrorIs(t, err, ErrMalformedRef, "a reader short of a slot")
	_, err = f.owner.BroadcastBatch(ctx, nil, refs, BroadcastConfig{})
	assert.ErrorIs(t, err, ErrMalformedRef)
	_, err = f.readers[1].BroadcastBatch(ctx, srcs, refs, BroadcastConfig{})
	assert.ErrorIs(t, err, ErrNotOwner, "nothing to send")
	swapped := [][]Ref{{refs[0][1], refs[0][0]}}
	res, err := f.owner.BroadcastBatch(ctx, srcs, swapped, BroadcastConfig{})
	require.NoError(t, err)
	assert.ErrorIs(t, res.Readers[0].Err, tensor.ErrTooSmall, "slots in the wrong order")
	split := [][]Ref{{refs[1][0], refs[2][1]}}
	res, err = f.owner.BroadcastBatch(ctx, srcs, split, BroadcastConfig{})
	require.NoError(t, err)
	assert.ErrorIs(t, res.Readers[0].Err, ErrMalformedRef, "one reader's slots on two runtimes")
}

// A reader that dies mid-batch is routed around as in a single
// broadcast: its orphan is re-parented with every object of the batch.
func TestBroadcastBatchReparent(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 1024, 1)
	srcs, data := stateDict(t, f, 2<<20, 3000, 1<<20+1)
	slots, refs := reserveDict(t, f, srcs)
	// Chain: owner → h1 (reader 1) → h2 (reader 2) → h3 (reader 3).
	f.rts[2].faults.DropChunks.Store(true)
	h := f.owner.StartBroadcastBatch(ctx, srcs, refs, BroadcastConfig{ChunkSize: 256 << 10})
	waitRelay(t, slots[2][0])
	dead, cancel := context.WithCancel(ctx)
	cancel()
	f.rts[2].faults.AbandonHolds.Store(true)
	require.NoError(t, f.rts[2].Shutdown(dead))
	res, err := h.Await(ctx)
	require.NoError(t, err)
	t.Logf("planned:\n%s\nfollowed:\n%s", res.Plan, res)
	assert.ErrorIs(t, res.Readers[2].Err, ErrReaderDied)
	assert.Equal(t, 1, res.Readers[3].FedBy, "re-parented to h1's reader")
	assert.Equal(t, 2, res.Readers[3].Parent)
	for _, j := range []int{0, 1, 3} {
		require.NoError(t, res.Readers[j].Err, "reader %d", j)
		for k, s := range slots[j] {
			checkSlot(t, s, 0, data[k])
		}
	}
}

// The same with flow-controlled slots, the orphan having a whole object
// already when its parent dies: the new feeder's repeat of that object
// meets a slot that is not done with its generation, which means the
// orphan has it, not that the orphan failed.
func TestBroadcastBatchReparentFlow(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 1024, 1)
	srcs, data := stateDict(t, f, 3000, 2<<20, 1<<20+1)
	slots, refs := reserveDict(t, f, srcs, WithGenerations())
	// Chain: owner → h1 (reader 1) → h2 (reader 2) → h3 (reader 3); h2
	// takes the first chunk only (the whole first object) and forwards it.
	f.rts[2].faults.DropChunks.Store(true)
	h := f.owner.StartBroadcastBatch(ctx, srcs, refs, BroadcastConfig{ChunkSize: 256 << 10})
	require.Eventually(t, func() bool { return slots[3][0].Pushes() == 1 }, 20*time.Second, time.Millisecond, "h3 has the first object")
	dead, cancel := context.WithCancel(ctx)
	cancel()
	f.rts[2].faults.AbandonHolds.Store(true)
	require.NoError(t, f.rts[2].Shutdown(dead))
	res, err := h.Await(ctx)
	require.NoError(t, err)
	t.Logf("planned:\n%s\nfollowed:\n%s", res.Plan, res)
	assert.ErrorIs(t, res.Readers[2].Err, ErrReaderDied)
	assert.True(t, res.Readers[3].Reparented())
	assert.Positive(t, counter(t, f.rts[3], "tensorlane_broadcast_repeats_skipped_total"), "the first object was not sent to h3 again")
	for _, j := range []int{0, 1, 3} {
		require.NoError(t, res.Readers[j].Err, "reader %d", j)
		for k, s := range slots[j] {
			assert.Equal(t, uint64(1), checkSlot(t, s, 0, data[k]), "reader %d object %d: one generation", j, k)
		}
	}
}
