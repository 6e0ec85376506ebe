package rdt

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestPushBatchCoalesced: a batch of pushes into another host's slots
// (tcp, rdma), or into slots of another runtime of the same host (p2p
// onto GPU 1, NVLink-linked to the owner's GPU 0; shm into host memory),
// moves coalesced over the batch-capable path and is announced in one
// notice; a closed slot, a forged one, a source not this runtime's and a
// slot named twice fail on their own and leave their slots' generations
// where they were; every good slot advances exactly once.
func TestPushBatchCoalesced(t *testing.T) {
	for _, c := range []struct {
		tr  string
		dst tensor.DeviceID
	}{{fabric.TCP, tensor.GPUDevice(1)}, {fabric.RDMA, tensor.GPUDevice(1)}, {fabric.P2P, tensor.GPUDevice(1)}, {fabric.SHM, tensor.HostDevice}} {
		tr := c.tr
		t.Run(tr, func(t *testing.T) {
			ctx := context.Background()
			var rts []*Runtime
			if tr == fabric.P2P || tr == fabric.SHM {
				a, b := sameHost(t)
				rts = []*Runtime{a, b}
			} else {
				only := func(c *Config) { c.Transports.Allow = []string{tr} }
				rts = cluster(t, only, only)
			}
			owner, _ := rts[0].Spawn("trainer")
			reader, _ := rts[1].Spawn("worker")
			const n = 40
			var srcs, dsts []Ref
			var want []tensor.Tensor
			var slots []*Slot
			for i := range n {
				x := fill(t, rts[0], tensor.GPUDevice(0), tensor.BFloat16, int64(1+i%5), 2048)
				ref, err := owner.Put(ctx, x)
				require.NoError(t, err)
				s, err := reader.Reserve(ctx, ref.Desc, c.dst, WithGenerations())
				require.NoError(t, err)
				t.Cleanup(func() { s.Close() })
				srcs, dsts, want, slots = append(srcs, ref), append(dsts, s.Ref()), append(want, x), append(slots, s)
			}
			// Bad items: a closed slot, a forged slot token, a source of
			// the reader's, and slot 0 named a second time.
			require.NoError(t, slots[3].Close())
			forged := dsts[5]
			forged.Token = []byte("not the token")
			dsts[5] = forged
			foreign, err := reader.Put(ctx, fill(t, rts[1], c.dst, tensor.BFloat16, 1, 2048))
			require.NoError(t, err)
			srcs[7] = foreign
			srcs, dsts = append(srcs, srcs[0]), append(dsts, dsts[0])
			bad := map[int]error{3: ErrObjectNotFound, 5: ErrUnauthorized, 7: ErrNotOwner, n: ErrMalformedRef}

			bp := owner.ExplainPushBatch(srcs, dsts)
			require.Len(t, bp.Groups, 1, "%v", bp)
			assert.Equal(t, BatchGroup{Owner: shortID(rts[1].host.ID()), Transport: tr, Refs: n, Bytes: bp.Groups[0].Bytes, Coalesced: true,
				Reason: tr + " moves many objects to one destination together"}, bp.Groups[0])
			assert.Equal(t, 1, bp.Refused, "the source this runtime does not own")
			before := rts[1].sinks.Notices.Load()
			xs, errs := owner.PushBatch(ctx, srcs, dsts, BatchConfig{})
			require.Len(t, errs, n+1)
			for i, err := range errs {
				if w := bad[i]; w != nil {
					assert.ErrorIs(t, err, w, "item %d", i)
					continue
				}
				require.NoError(t, err, "item %d", i)
				assert.Equal(t, tr, xs[i].Stats.Transport, "item %d", i)
				assert.Equal(t, n-1, xs[i].Stats.Coalesced, "item %d moved with every item that reached the path (all but the foreign source and the repeated slot)", i)
				assert.Equal(t, n-3, xs[i].Notified, "item %d: one notice for every push that landed", i)
				assert.Equal(t, tr, xs[i].Plan.Chosen, "item %d: the plan names the coalescing path", i)
				cur, done := slots[i].Generation()
				assert.Equal(t, [2]uint64{1, 0}, [2]uint64{cur, done}, "slot %d advanced once", i)
				_, got, err := slots[i].Wait(ctx, 0)
				require.NoError(t, err)
				sameBytes(t, want[i], got)
			}
			assert.Equal(t, int64(1), rts[1].sinks.Notices.Load()-before, "one push notice for the whole batch")
			assert.Equal(t, 1.0, counter(t, rts[1], "tensorlane_push_notices_total"))
			assert.Equal(t, float64(n-3), counter(t, rts[1], "tensorlane_push_notice_items_total"), "the pushes that landed")
			for _, i := range []int{5, 7} {
				cur, _ := slots[i].Generation()
				assert.Zero(t, cur, "slot %d of a failed item did not advance", i)
			}

			// The next step: the slots are not done yet, so every push is
			// refused and nothing advances; once done, all advance to 2.
			good := []int{0, 1, 2, 4, 6, 8}
			var s2, d2 []Ref
			for _, i := range good {
				s2, d2 = append(s2, srcs[i]), append(d2, dsts[i])
			}
			_, errs = owner.PushBatch(ctx, s2, d2, BatchConfig{})
			for k, err := range errs {
				assert.ErrorIs(t, err, ErrSlotBusy, "item %d: the owner's refusal arrives typed over the data path", k)
				cur, _ := slots[good[k]].Generation()
				assert.Equal(t, uint64(1), cur)
			}
			for _, i := range good {
				require.NoError(t, slots[i].Done(ctx, 1))
			}
			xs, errs = owner.PushBatch(ctx, s2, d2, BatchConfig{})
			for k, err := range errs {
				require.NoError(t, err, "item %d", k)
				assert.Equal(t, len(good), xs[k].Notified)
				cur, _ := slots[good[k]].Generation()
				assert.Equal(t, uint64(2), cur, "slot %d", good[k])
			}
		})
	}
}

// TestPushBatchSeparate: cfg.Separate pushes item by item (one notice
// each), the comparison bench statedict makes.
func TestPushBatchSeparate(t *testing.T) {
	ctx := context.Background()
	only := func(c *Config) { c.Transports.Allow = []string{fabric.TCP} }
	rts := cluster(t, only, only)
	owner, _ := rts[0].Spawn("trainer")
	reader, _ := rts[1].Spawn("worker")
	var srcs, dsts []Ref
	for range 5 {
		ref, err := owner.Put(ctx, fill(t, rts[0], tensor.GPUDevice(0), tensor.Uint8, 4096))
		require.NoError(t, err)
		s, err := reader.Reserve(ctx, ref.Desc, tensor.GPUDevice(1))
		require.NoError(t, err)
		defer s.Close()
		srcs, dsts = append(srcs, ref), append(dsts, s.Ref())
	}
	before := rts[1].sinks.Notices.Load()
	xs, errs := owner.PushBatch(ctx, srcs, dsts, BatchConfig{Separate: true})
	for i, err := range errs {
		require.NoError(t, err)
		assert.Zero(t, xs[i].Stats.Coalesced)
		assert.Zero(t, xs[i].Notified)
	}
	assert.Equal(t, int64(5), rts[1].sinks.Notices.Load()-before)
}

// TestPushBatchToSelf: slots of the pushing runtime itself are told
// without a notice on the wire, and advance once each.
func TestPushBatchToSelf(t *testing.T) {
	ctx := context.Background()
	rts := cluster(t, nil)
	a, _ := rts[0].Spawn("a")
	var srcs, dsts []Ref
	var slots []*Slot
	for range 3 {
		ref, err := a.Put(ctx, fill(t, rts[0], tensor.GPUDevice(0), tensor.Uint8, 4096))
		require.NoError(t, err)
		s, err := a.Reserve(ctx, ref.Desc, tensor.GPUDevice(1))
		require.NoError(t, err)
		defer s.Close()
		srcs, dsts, slots = append(srcs, ref), append(dsts, s.Ref()), append(slots, s)
	}
	xs, errs := a.PushBatch(ctx, srcs, dsts, BatchConfig{})
	for i, err := range errs {
		require.NoError(t, err)
		assert.Equal(t, 3, xs[i].Notified)
		assert.Equal(t, uint64(1), slots[i].Pushes())
	}
}

// The push batch notice, byte for byte, and its refusals.
func TestPushBatchNoticeWire(t *testing.T) {
	n := ctlwire.PushBatchNotice{Incarnation: 300, Items: []ctlwire.PushBatchItem{
		{Slot: fabric.ObjectID{0xaa, 15: 0xbb}, Token: []byte("tk"), Bytes: 4096},
		{Slot: fabric.ObjectID{1}, Bytes: 0},
	}}
	got := fmt.Sprintf("%x", n.Marshal())
	want := "10" + "ac02" + "02" + "aa0000000000000000000000000000bb" + "02746b" + "8020" +
		"01000000000000000000000000000000" + "00" + "00"
	assert.Equal(t, want, got)
	back, err := ctlwire.ParsePushBatchNotice(n.Marshal())
	require.NoError(t, err)
	assert.Equal(t, n.Incarnation, back.Incarnation)
	require.Len(t, back.Items, 2)
	assert.Equal(t, n.Items[0], back.Items[0])
	assert.Equal(t, int64(0), back.Items[1].Bytes)

	huge := []byte{ctlwire.PushBatch, 1, 0xff, 0xff, 0xff, 0xff, 0x0f}
	for name, p := range map[string][]byte{
		"empty":         nil,
		"wrong kind":    {1, 0, 1},
		"zero items":    {ctlwire.PushBatch, 1, 0},
		"count 2^32":    huge,
		"over maxItems": append([]byte{ctlwire.PushBatch, 1, 0x81, 0x08}, make([]byte, 1025*ctlwire.MinPushItem)...),
		"count > bytes": append([]byte{ctlwire.PushBatch, 1, 10}, make([]byte, 9*ctlwire.MinPushItem)...),
		"truncated":     n.Marshal()[:20],
		"trailing":      append(n.Marshal(), 0),
	} {
		_, err := ctlwire.ParsePushBatchNotice(p)
		assert.ErrorIs(t, err, ErrMalformedRef, name)
	}
	assert.Equal(t, []byte{0}, ctlwire.AnswerPushBatch([]error{nil, nil}))
	assert.Equal(t, []byte{ctlwire.StatusItems, 0, 1, 2}, ctlwire.AnswerPushBatch([]error{nil, ErrObjectNotFound, ErrUnauthorized}))
}

func FuzzPushBatchNotice(f *testing.F) {
	f.Add(ctlwire.PushBatchNotice{Incarnation: 1, Items: []ctlwire.PushBatchItem{{Token: []byte("x"), Bytes: 5}}}.Marshal())
	f.Fuzz(func(t *testing.T, p []byte) {
		n, err := ctlwire.ParsePushBatchNotice(p)
		if err != nil {
			if !errors.Is(err, ErrMalformedRef) {
				t.Fatalf("untyped: %v", err)
			}
			return
		}
		if len(n.Items) == 0 || len(n.Items) > ctlwire.MaxPushBatch {
			t.Fatalf("%d items", len(n.Items))
		}
		again, err := ctlwire.ParsePushBatchNotice(n.Marshal())
		if err != nil || len(again.Items) != len(n.Items) {
			t.Fatalf("re-encoding differs: %v", err)
		}
	})
}

// A notice that names one slot twice (only a forged one can) advances it
// once; an unknown slot fails its item alone.
func TestPushedBatchOncePerSlot(t *testing.T) {
	ctx := context.Background()
	rts := cluster(t, nil)
	a, _ := rts[0].Spawn("a")
	desc := tensor.NewDesc(tensor.Uint8, 64)
	s, err := a.Reserve(ctx, desc, tensor.GPUDevice(0))
	require.NoError(t, err)
	defer s.Close()
	it := ctlwire.PushBatchItem{Slot: s.s.ID, Token: s.s.Token, Bytes: 64}
	errs := rts[0].sinks.PushedBatch("someone", ctlwire.PushBatchNotice{Incarnation: rts[0].incarnation, Items: []ctlwire.PushBatchItem{it, it, {Slot: fabric.ObjectID{9}, Bytes: 64}}})
	assert.NoError(t, errs[0])
	assert.ErrorIs(t, errs[1], ErrMalformedRef)
	assert.ErrorIs(t, errs[2], ErrObjectNotFound)
	assert.Equal(t, uint64(1), s.Pushes())
	assert.Equal(t, []byte{ctlwire.StatusItems, 0, 4, 1}, ctlwire.AnswerPushBatch(errs))
}

// TestPushBatchReaderLeaves: the slot runtime shuts down while a push
// batch into it is moving; the batch ends within the bound, and each item
// either completed or failed with a typed error.
func TestPushBatchReaderLeaves(t *testing.T) {
	for _, tr := range []string{fabric.TCP, fabric.RDMA} {
		t.Run(tr, func(t *testing.T) {
			ctx := context.Background()
			only := func(c *Config) { c.Transports.Allow = []string{tr} }
			rts := cluster(t, only, only)
			owner, _ := rts[0].Spawn("trainer")
			reader, _ := rts[1].Spawn("worker")
			var srcs, dsts []Ref
			var slots []*Slot
			for range 40 {
				ref, err := owner.Put(ctx, fill(t, rts[0], tensor.GPUDevice(0), tensor.Uint8, 1<<20))
				require.NoError(t, err)
				s, err := reader.Reserve(ctx, ref.Desc, tensor.GPUDevice(1))
				require.NoError(t, err)
				srcs, dsts, slots = append(srcs, ref), append(dsts, s.Ref()), append(slots, s)
			}
			done := make(chan []error, 1)
			go func() {
				_, errs := owner.PushBatch(ctx, srcs, dsts, BatchConfig{})
				done <- errs
			}()
			// Leave once a write into one of the slots has begun (or soon).
			writing := func() bool {
				for _, s := range slots {
					if s.s.Pinned() {
						return true
					}
				}
				return false
			}
			for deadline := time.Now().Add(2 * time.Second); !writing() && time.Now().Before(deadline); {
				time.Sleep(50 * time.Microsecond)
			}
			require.NoError(t, rts[1].Shutdown(ctx))
			var errs []error
			select {
			case errs = <-done:
			case <-time.After(30 * time.Second):
				t.Fatal("HUNG: PushBatch into a runtime that shut down")
			}
			failed := 0
			for i, err := range errs {
				if err == nil {
					continue
				}
				failed++
				typed := errors.Is(err, ErrOwnerClosed) || errors.Is(err, fabric.ErrPeerClosed) || errors.Is(err, ErrObjectNotFound) ||
					errors.Is(err, ErrPeerUnreachable) || errors.Is(err, fabric.ErrNoPath) || errors.Is(err, ErrClosed) || errors.Is(err, fabric.ErrStalled)
				assert.True(t, typed, "item %d: untyped %v", i, err)
			}
			t.Logf("%d of %d pushes failed as the slot runtime left", failed, len(errs))
		})
	}
}
