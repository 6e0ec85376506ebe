package rdt

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// TestGetBatchCoalesced: a batch from another host moves coalesced over
// the batch-capable path (every item says with how many others), freed
// and forged refs among them fail on their own.
func TestGetBatchCoalesced(t *testing.T) {
	// tcp and rdma between two hosts; p2p (onto GPU 1, NVLink-linked to
	// the owner's GPU 0) and shm (host memory) between two runtimes of one
	// host, two processes to the planner.
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
			var refs []Ref
			var want []tensor.Tensor
			for i := range 60 {
				x := fill(t, rts[0], tensor.GPUDevice(0), tensor.BFloat16, int64(1+i%5), 2048)
				ref, err := owner.Put(ctx, x)
				require.NoError(t, err)
				refs = append(refs, ref)
				want = append(want, x)
			}
			require.NoError(t, owner.Free(ctx, refs[7]))
			forged := refs[9]
			forged.Token = []byte("not the token")
			refs = append(refs, forged)
			bp := reader.ExplainBatch(refs, c.dst)
			require.Len(t, bp.Groups, 1, "%v", bp)
			assert.Equal(t, BatchGroup{Owner: shortID(rts[0].host.ID()), Transport: tr, Refs: 61, Bytes: bp.Groups[0].Bytes, Coalesced: true,
				Reason: tr + " moves many objects of one owner together"}, bp.Groups[0])
			assert.Contains(t, bp.String(), "coalesced")
			items, err := reader.GetBatch(ctx, refs, c.dst, BatchConfig{})
			require.NoError(t, err)
			defer ReleaseBatch(items)
			for i, it := range items {
				switch i {
				case 7:
					assert.ErrorIs(t, it.Err, ErrObjectFreed)
				case 60:
					assert.ErrorIs(t, it.Err, ErrUnauthorized)
				default:
					require.NoError(t, it.Err, "item %d", i)
					sameBytes(t, want[i], it.Tensor)
					assert.Equal(t, tr, it.Transfer.Stats.Transport, "item %d", i)
					assert.Equal(t, 59, it.Transfer.Stats.Coalesced, "item %d moved with the other 58 valid ones", i)
				}
			}
			assert.Equal(t, 59.0, counter(t, rts[1], "tensorlane_coalesced_transfers_total"))
		})
	}
}

// TestBatchLeaseRenewedOnce: the leases a batch took are renewed in one
// message per owner per period, whatever the number of refs.
func TestBatchLeaseRenewedOnce(t *testing.T) {
	ctx := context.Background()
	rts := cluster(t, nil, nil)
	owner, _ := rts[0].Spawn("trainer")
	reader, _ := rts[1].Spawn("worker")
	const n = 300
	var refs []Ref
	for range n {
		x := fill(t, rts[0], tensor.GPUDevice(0), tensor.Uint8, 64)
		ref, err := owner.Put(ctx, x)
		require.NoError(t, err)
		refs = append(refs, ref)
	}
	items, err := reader.GetBatch(ctx, refs, tensor.GPUDevice(1), BatchConfig{})
	require.NoError(t, err)
	// Hold the items while renewals are counted: released, their leases
	// would only linger for a short grace, and a slow machine could see them
	// lapse before the first sample.
	defer ReleaseBatch(items)
	require.Equal(t, n, rts[1].holdCount())
	// Both counters move together at the end of each lease message: read
	// until a pair is not torn by a renewal in between.
	sample := func() (msgs, claims float64) {
		for {
			m := counter(t, rts[0], "tensorlane_lease_messages_total")
			c := counter(t, rts[0], "tensorlane_lease_requests_total")
			if counter(t, rts[0], "tensorlane_lease_messages_total") == m {
				return m, c
			}
		}
	}
	m0, c0 := sample()
	// Several renewal periods (LeaseRenew is 40 ms here).
	require.Eventually(t, func() bool { m, _ := sample(); return m >= m0+3 }, 10*time.Second, 10*time.Millisecond)
	m1, c1 := sample()
	assert.Equal(t, float64(n)*(m1-m0), c1-c0, "every renewal message carries all %d claims", n)
}

// TestGetBatchOwnerDies: an owner that dies while a coalesced batch moves
// ends every item within the bound, each with its tensor (verified),
// ErrOwnerDied or ErrOwnerClosed, and every byte of the reader's memory for the failed ones
// goes back.
func TestGetBatchOwnerDies(t *testing.T) {
	for _, tr := range []string{fabric.TCP, fabric.RDMA} {
		t.Run(tr, func(t *testing.T) {
			p := newPair(t, func(c *Config) {
				fastLife(c)
				c.Transports.Allow = []string{tr}
				c.Transports.Streams = 1
			})
			ctx := context.Background()
			owner, _ := p.a.Spawn("owner")
			reader, _ := p.b.Spawn("reader")
			require.NoError(t, p.b.Connect(ctx, p.a.AddrInfo()))
			var refs []Ref
			var want [][]byte // copies: the owner's memory goes with it
			for range 24 {
				x := fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 8<<20)
				ref, err := owner.Put(ctx, x)
				require.NoError(t, err)
				b, err := x.SpanBytes()
				require.NoError(t, err)
				refs, want = append(refs, ref), append(want, bytes.Clone(b))
			}
			type result struct {
				items []BatchItem
				err   error
			}
			res := make(chan result, 1)
			go func() {
				gctx, cancel := context.WithTimeout(ctx, 60*time.Second)
				defer cancel()
				items, err := reader.GetBatch(gctx, refs, tensor.GPUDevice(0), BatchConfig{})
				res <- result{items, err}
			}()
			waitPinned(t, p.a)
			dead, cancel := context.WithCancel(ctx)
			cancel()
			require.NoError(t, p.a.Shutdown(dead))
			var r result
			select {
			case r = <-res:
			case <-time.After(60 * time.Second):
				t.Fatal("HUNG: GetBatch did not return after its owner died")
			}
			require.NoError(t, r.err)
			failed := 0
			for i, it := range r.items {
				if it.Err != nil {
					failed++
					// ErrOwnerClosed: a request the owner took in while it
					// shut down, refused in its last moments.
					assert.True(t, errors.Is(it.Err, ErrOwnerDied) || errors.Is(it.Err, ErrOwnerClosed), "item %d: %v", i, it.Err)
					continue
				}
				got, err := it.Tensor.SpanBytes()
				require.NoError(t, err)
				assert.True(t, bytes.Equal(want[i], got), "item %d: bytes differ", i)
			}
			t.Logf("%d of %d items failed with the owner's death", failed, len(refs))
			ReleaseBatch(r.items)
			assert.Equal(t, int64(0), used(t, p.b, tensor.GPUDevice(0)), "every byte of the reader's memory went back")
			require.Eventually(t, func() bool { return p.b.holdCount() == 0 }, 10*time.Second, 10*time.Millisecond, "holds on a dead owner are dropped")
		})
	}
}

// TestHeldOwnerWatched: an actor that holds refs of an owner, with nothing
// moving from it, still learns when that owner stops answering: its holds
// are dropped once the owner is declared dead. Before, owners were watched
// only while a Get was in flight, so a batch that ended before the death
// was noticed left its holds renewing forever.
func TestHeldOwnerWatched(t *testing.T) {
	p := newPair(t, fastLife)
	ctx := context.Background()
	owner, _ := p.a.Spawn("owner")
	reader, _ := p.b.Spawn("reader")
	require.NoError(t, p.b.Connect(ctx, p.a.AddrInfo()))
	var refs []Ref
	for range 3 {
		ref, err := owner.Put(ctx, fill(t, p.a, tensor.GPUDevice(0), tensor.Uint8, 4096))
		require.NoError(t, err)
		refs = append(refs, ref)
	}
	items, err := reader.GetBatch(ctx, refs, tensor.GPUDevice(0), BatchConfig{})
	require.NoError(t, err)
	for _, it := range items {
		require.NoError(t, it.Err)
	}
	ReleaseBatch(items)
	require.Equal(t, len(refs), p.b.holdCount(), "the reader's actor holds every ref")
	p.a.faults.Hung.Store(true) // a hung owner: no heartbeat answers, nothing closed
	require.Eventually(t, func() bool { return p.b.holdCount() == 0 }, 10*time.Second, 10*time.Millisecond,
		"holds on an owner that stopped answering are dropped")
}
