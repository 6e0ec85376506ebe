package rdt

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"testing"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// fleet is an owner on h0 and readers on four simulated hosts, two per host
// (GPU 0 and 1; on h0 GPU 1 and 2, the owner being on GPU 0).
type fleet struct {
	rts     []*Runtime
	owner   *Actor
	readers []*Actor // one actor per runtime
	slots   []*Slot
	src     Ref
	data    []byte
}

func newFleet(t *testing.T, size int64, perHost int, opts ...SlotOption) *fleet {
	t.Helper()
	ctx := context.Background()
	f := &fleet{rts: cluster(t, nil, nil, nil, nil)}
	var err error
	f.owner, err = f.rts[0].Spawn("trainer")
	require.NoError(t, err)
	for i, r := range f.rts {
		if i > 0 {
			require.NoError(t, r.Connect(ctx, f.rts[0].AddrInfo()))
		}
		a, err := r.Spawn("worker")
		require.NoError(t, err)
		f.readers = append(f.readers, a)
	}
	mem, err := f.rts[0].Memory(tensor.GPUDevice(0))
	require.NoError(t, err)
	x, err := tensor.Alloc(ctx, mem, tensor.Uint8, size)
	require.NoError(t, err)
	f.data, err = x.SpanBytes()
	require.NoError(t, err)
	rand.Read(f.data)
	f.src, err = f.owner.Put(ctx, x)
	require.NoError(t, err)
	for i, a := range f.readers {
		for d := range perHost {
			dev := d
			if i == 0 {
				dev++ // the owner's GPU 0 is taken
			}
			s, err := a.Reserve(ctx, f.src.Desc, tensor.GPUDevice(dev), opts...)
			require.NoError(t, err)
			t.Cleanup(func() { s.Close() })
			f.slots = append(f.slots, s)
		}
	}
	return f
}

func (f *fleet) refs() []Ref {
	out := make([]Ref, len(f.slots))
	for i, s := range f.slots {
		out[i] = s.Ref()
	}
	return out
}

func checkSlot(t *testing.T, s *Slot, after uint64, want []byte) uint64 {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	gen, x, err := s.Wait(ctx, after)
	require.NoError(t, err)
	got, err := x.SpanBytes()
	require.NoError(t, err)
	require.True(t, bytes.Equal(got, want), "slot bytes differ")
	return gen
}

func TestBroadcastTree(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 3<<20+17, 2, WithGenerations())
	plan := f.owner.ExplainBroadcast(f.src, f.refs())
	t.Logf("\n%s", plan)
	// The owner feeds its host's first reader and the first remote host's
	// leader; every other reader is fed by another reader.
	fedByOwner := 0
	for i, n := range plan.Nodes {
		if n.Parent == -1 {
			fedByOwner++
			continue
		}
		parent := plan.Nodes[n.Parent]
		if f.slots[i].Ref().Host == f.slots[n.Parent].Ref().Host {
			assert.Contains(t, []string{fabric.P2P, fabric.SHM, fabric.Local}, n.Path, "on-host edge %d<-%d (%s)", i, n.Parent, parent.Endpoint)
		} else {
			assert.True(t, n.Leader && parent.Leader, "cross-host edges join host leaders: %+v <- %+v", n, parent)
			assert.Contains(t, []string{fabric.RDMA, fabric.TCP}, n.Path)
		}
	}
	assert.Equal(t, 2, fedByOwner, "the owner's egress carries each byte about once")
	assert.Contains(t, plan.String(), "host leader")

	res, err := f.owner.Broadcast(ctx, f.src, f.refs(), BroadcastConfig{ChunkSize: 512 << 10})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	assert.Equal(t, len(f.slots), res.OK())
	for i, s := range f.slots {
		assert.Equal(t, uint64(1), res.Readers[i].Generation)
		assert.Equal(t, uint64(1), checkSlot(t, s, 0, f.data))
	}

	// Flow control: a reader that is not done with generation 1 is not
	// overwritten; the others get step 2.
	for _, s := range f.slots[1:] {
		require.NoError(t, s.Done(ctx, 1))
	}
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	others := *res
	others.Readers = res.Readers[1:]
	require.NoError(t, others.WaitConsumed(wctx))
	before := bytes.Clone(f.data)
	f.data[0] ^= 0xff
	res2, err := f.owner.Broadcast(ctx, f.src, f.refs(), BroadcastConfig{ChunkSize: 1 << 20, BusyWait: 200 * time.Millisecond})
	require.NoError(t, err)
	assert.ErrorIs(t, res2.Readers[0].Err, ErrSlotBusy)
	assert.Equal(t, len(f.slots)-1, res2.OK(), "%v", res2.Err())
	_, x, err := f.slots[0].Wait(ctx, 0)
	require.NoError(t, err)
	got, _ := x.SpanBytes()
	assert.True(t, bytes.Equal(got, before), "the busy reader's generation 1 was not touched")
	for _, s := range f.slots[1:] {
		assert.Equal(t, uint64(2), checkSlot(t, s, 1, f.data))
	}
	assert.Equal(t, float64(2*len(f.slots)-1), counter(t, f.rts[0], "tensorlane_broadcast_readers_total")-1)
}

func TestBroadcastBadReaders(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 1<<20, 1)
	refs := f.refs()
	// A reader that never reserved: a slot ref nobody holds.
	ghost := refs[2]
	rand.Read(ghost.Object[:])
	// A slot of the wrong size, and one closed before the broadcast.
	small, err := f.readers[1].Reserve(ctx, tensor.Desc{DType: tensor.Uint8, Shape: []int64{10}, Strides: []int64{1}}, tensor.GPUDevice(3))
	require.NoError(t, err)
	defer small.Close()
	require.NoError(t, f.slots[3].Close())
	all := append(refs, ghost, small.Ref())
	res, err := f.owner.Broadcast(ctx, f.src, all, BroadcastConfig{ChunkSize: 256 << 10})
	require.NoError(t, err)
	assert.NoError(t, res.Readers[0].Err)
	assert.NoError(t, res.Readers[1].Err)
	assert.NoError(t, res.Readers[2].Err)
	assert.ErrorIs(t, res.Readers[3].Err, ErrObjectNotFound, "closed slot")
	assert.ErrorIs(t, res.Readers[4].Err, ErrObjectNotFound, "never reserved")
	assert.ErrorIs(t, res.Readers[5].Err, tensor.ErrTooSmall)
	assert.Equal(t, 3, res.OK())
	for _, s := range f.slots[:3] {
		checkSlot(t, s, 0, f.data)
	}
	// Bad calls fail whole, at once.
	_, err = f.owner.Broadcast(ctx, f.src, nil, BroadcastConfig{})
	assert.ErrorIs(t, err, ErrMalformedRef)
	_, err = f.readers[1].Broadcast(ctx, f.src, refs, BroadcastConfig{})
	assert.ErrorIs(t, err, ErrNotOwner)
	_, err = f.owner.Broadcast(ctx, f.src, []Ref{refs[0], refs[0]}, BroadcastConfig{})
	assert.ErrorIs(t, err, ErrMalformedRef)
	_, err = f.owner.Broadcast(ctx, f.src, refs, BroadcastConfig{ChunkSize: 1})
	assert.ErrorIs(t, err, ErrMalformedRef, "a million and more chunks")
}

// waitRelay waits until slot s has received some but not all chunks.
func waitRelay(t *testing.T, s *Slot) {
	t.Helper()
	require.Eventually(t, func() bool {
		return bcastrun.Landed(s.s) > 0
	}, 20*time.Second, 200*time.Microsecond, "the broadcast never reached the slot")
}

func TestBroadcastReaderLeavesMidStep(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 24<<20, 2)
	// h1's runtime (two readers, one of them the leader that feeds h2)
	// dies once data reaches it.
	h := f.owner.StartBroadcast(ctx, f.src, f.refs(), BroadcastConfig{ChunkSize: 256 << 10})
	waitRelay(t, f.slots[2])
	dead, cancel := context.WithCancel(ctx)
	cancel()
	f.rts[1].faults.AbandonHolds.Store(true)
	require.NoError(t, f.rts[1].Shutdown(dead))
	res, err := h.Await(ctx)
	require.NoError(t, err)
	t.Logf("\n%s", res.Plan)
	for i, rr := range res.Readers {
		t.Logf("reader %d %s: fed by %s, err %v", i, rr.Slot.Host, rr.Fed, rr.Err)
	}
	for i, rr := range res.Readers {
		if rr.Slot.Host == "h1" {
			if rr.Err == nil {
				continue // it finished before the runtime went
			}
			assert.Error(t, rr.Err)
			continue
		}
		require.NoError(t, rr.Err, "reader %d on %s is routed around h1", i, rr.Slot.Host)
		checkSlot(t, f.slots[i], 0, f.data)
	}
	assert.Equal(t, int64(len(f.slots)-res.OK())*0, int64(0))
	assert.Equal(t, Progress{Done: int64(res.OK()) * res.Bytes, Total: res.Bytes * int64(len(f.slots))}, h.Progress())
}

func TestBroadcastOwnerDies(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 24<<20, 2)
	h := f.owner.StartBroadcast(ctx, f.src, f.refs(), BroadcastConfig{ChunkSize: 256 << 10})
	waitRelay(t, f.slots[2])
	dead, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, f.rts[0].Shutdown(dead))
	_, _ = h.Await(ctx)
	for i, s := range f.slots {
		if s.rt == f.rts[0] {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		gen, _, err := s.Wait(wctx, 0)
		cancel()
		if gen > 0 {
			continue // it completed before the owner went
		}
		assert.ErrorIs(t, err, ErrOwnerDied, "reader %d", i)
	}
	// Nothing is pinned: once the slots close, every byte is back.
	for i, r := range f.rts[1:] {
		for _, s := range f.slots {
			if s.rt == r {
				s.Close()
			}
		}
		assert.Eventually(t, func() bool {
			return used(t, r, tensor.GPUDevice(0))+used(t, r, tensor.GPUDevice(1)) == 0
		}, 10*time.Second, time.Millisecond, "h%d's reserved bytes return", i+1)
	}
}

func TestBroadcastAsyncCancel(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 16<<20, 1)
	h := f.owner.StartBroadcast(ctx, f.src, f.refs(), BroadcastConfig{ChunkSize: 128 << 10})
	waitRelay(t, f.slots[1])
	h.Cancel()
	h.Cancel()
	res, err := h.Await(ctx)
	require.NoError(t, err)
	for i, rr := range res.Readers {
		if rr.Err != nil {
			assert.ErrorIs(t, rr.Err, context.Canceled, "reader %d", i)
		}
	}
	// The readers that did not complete are told, not left to time out.
	for i, s := range f.slots {
		if res.Readers[i].Err == nil {
			continue
		}
		wctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		_, _, err := s.Wait(wctx, 0)
		cancel()
		assert.True(t, errors.Is(err, ErrBroadcastAborted), "reader %d: %v", i, err)
	}
}

func TestBcastMsgEncoding(t *testing.T) {
	f := newFleet(t, 1024, 1)
	m := bcastrun.Msg{Kind: ctlwire.Children, Off: 7, N: 9, Gen: 3, OriginInc: 5, Text: "x", Token: []byte("tok"), Children: wireRefs(f.refs()[:2]),
		Items: []bcast.Item{{Token: []byte("a"), N: 5, DType: tensor.BFloat16}, {N: 1 << 40}}, Gens: []uint64{1, 2}}
	rand.Read(m.ID[:])
	p, err := m.Marshal()
	require.NoError(t, err)
	got, err := bcastrun.ParseMsg(p)
	require.NoError(t, err)
	assert.Equal(t, m.ID, got.ID)
	assert.Equal(t, m.Off, got.Off)
	assert.Len(t, got.Children, 2)
	assert.Equal(t, m.Items, got.Items)
	assert.Equal(t, m.Gens, got.Gens)
	for _, bad := range [][]byte{nil, {0}, {9}, p[:len(p)-1], append(bytes.Clone(p), 0)} {
		_, err := bcastrun.ParseMsg(bad)
		assert.ErrorIs(t, err, ErrMalformedRef, "%x", bad)
	}
}

func FuzzBcastMsg(f *testing.F) {
	m := bcastrun.Msg{Kind: ctlwire.Chunk, Off: 1 << 20, N: 1 << 20, Token: []byte("t")}
	p, _ := m.Marshal()
	f.Add(p)
	f.Add([]byte{ctlwire.Report})
	f.Fuzz(func(t *testing.T, p []byte) {
		m, err := bcastrun.ParseMsg(p)
		if err != nil {
			return
		}
		q, err := m.Marshal()
		require.NoError(t, err)
		m2, err := bcastrun.ParseMsg(q)
		require.NoError(t, err)
		assert.Equal(t, m.Off, m2.Off)
	})
}

// A slot closed while a broadcast fills it: the broadcast stops, the slot's
// memory comes back, nothing panics.
func TestBroadcastSlotClosedMidway(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 24<<20, 1)
	h := f.owner.StartBroadcast(ctx, f.src, f.refs(), BroadcastConfig{ChunkSize: 256 << 10})
	waitRelay(t, f.slots[1])
	require.NoError(t, f.slots[1].Close())
	res, err := h.Await(ctx)
	require.NoError(t, err)
	assert.Error(t, res.Readers[1].Err)
	for i, rr := range res.Readers {
		if i != 1 {
			require.NoError(t, rr.Err, "reader %d", i)
			checkSlot(t, f.slots[i], 0, f.data)
		}
	}
	assert.Eventually(t, func() bool { return used(t, f.rts[1], tensor.GPUDevice(0)) == 0 }, 10*time.Second, time.Millisecond)
}

// The tree follows the topology: readers on the owner's host first (fed
// by the owner over the device link), then hosts of the owner's rack, then
// the rest; one leader per host, the others behind it.
func TestBroadcastPlanOrder(t *testing.T) {
	ctx := context.Background()
	cl, err := topology.Preset("dgx-h100", 4)
	require.NoError(t, err)
	racks := map[string]string{"h0": "rackA", "h1": "rackB", "h2": "rackA", "h3": "rackB"}
	for _, h := range cl.Hosts {
		h.Labels[topology.LabelRack] = racks[h.ID]
	}
	r, err := New(ctx, Config{Cluster: cl, Host: "h0", IgnoreEnv: true, RuntimeDir: t.TempDir(), DeviceMemory: 16 << 20})
	require.NoError(t, err)
	defer r.Shutdown(ctx)
	src := Ref{Owner: r.host.ID(), Incarnation: r.incarnation, Host: "h0", Device: tensor.GPUDevice(0)}
	slot := func(host string, dev int) Ref {
		return Ref{Owner: peer.ID("other-" + host), Incarnation: 1, Host: host, Device: tensor.GPUDevice(dev)}
	}
	slots := []Ref{slot("h1", 0), slot("h3", 1), slot("h2", 0), slot("h3", 0), slot("h2", 1), {Owner: r.host.ID(), Incarnation: r.incarnation, Host: "h0", Device: tensor.GPUDevice(1)}}
	plan := r.planBroadcast(src, slots)
	t.Logf("\n%s", plan)
	parent := func(i int) int { return plan.Nodes[i].Parent }
	assert.Equal(t, -1, parent(5), "the owner's host reader hangs off the owner")
	assert.Equal(t, -1, parent(2), "h2 (the owner's rack) is the first remote host")
	assert.True(t, plan.Nodes[2].Leader)
	assert.Equal(t, 2, parent(4), "h2's second reader behind its leader")
	assert.Equal(t, 2, parent(0), "then h1 (rackB, by name before h3)")
	assert.Equal(t, 0, parent(3), "then h3's leader (its GPU 0)")
	assert.Equal(t, 3, parent(1))
	assert.Equal(t, fabric.P2P, plan.Nodes[5].Path)
}

func TestBroadcastObserved(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 1<<20, 1)
	res, err := f.owner.Broadcast(ctx, f.src, f.refs(), BroadcastConfig{})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	n := 0
	for _, rec := range f.rts[0].RecentTransfers() {
		if rec.Reader == "trainer (broadcast)" {
			n++
			assert.Empty(t, rec.Error)
			assert.Equal(t, int64(1<<20), rec.Bytes)
		}
	}
	assert.Equal(t, len(f.slots), n, "one record per reader")
}

// A reader that leaves after the step landed does not hold the step up:
// WaitConsumed names it as dead instead of waiting for its Done.
func TestWaitConsumedReaderLeaves(t *testing.T) {
	ctx := context.Background()
	f := newFleet(t, 1<<20, 1, WithGenerations())
	res, err := f.owner.Broadcast(ctx, f.src, f.refs(), BroadcastConfig{})
	require.NoError(t, err)
	require.NoError(t, res.Err())
	for i, s := range f.slots {
		if s.rt != f.rts[2] {
			require.NoError(t, s.Done(ctx, res.Readers[i].Generation))
		}
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	f.rts[2].faults.AbandonHolds.Store(true)
	require.NoError(t, f.rts[2].Shutdown(dead))
	wctx, wcancel := context.WithTimeout(ctx, 20*time.Second)
	defer wcancel()
	err = res.WaitConsumed(wctx)
	require.ErrorIs(t, err, ErrReaderDied)
	assert.Contains(t, err.Error(), "h2")
	assert.NoError(t, wctx.Err(), "it did not wait for the deadline")
}

// killMidway starts a broadcast over f's fleet, lets the readers of
// runtime k take one chunk and no more, shuts k down as a crash would and
// returns the result.
func killMidway(t *testing.T, f *fleet, k int) *BroadcastResult {
	t.Helper()
	ctx := context.Background()
	f.rts[k].faults.DropChunks.Store(true)
	h := f.owner.StartBroadcast(ctx, f.src, f.refs(), BroadcastConfig{ChunkSize: 256 << 10})
	for i, s := range f.slots {
		if s.rt == f.rts[k] {
			waitRelay(t, f.slots[i])
		}
	}
	dead, cancel := context.WithCancel(ctx)
	cancel()
	f.rts[k].faults.AbandonHolds.Store(true)
	require.NoError(t, f.rts[k].Shutdown(dead))
	res, err := h.Await(ctx)
	require.NoError(t, err)
	t.Logf("planned:\n%s\nfollowed:\n%s", res.Plan, res)
	return res
}

// An inner reader of the chain of hosts dies mid-transfer: its orphan (the
// next host's leader, with that host's other reader behind it) is
// re-parented to the dead reader's parent, which has the chunks, not to the
// owner; every other reader completes with the bytes; the result says who
// has the data and which edge changed.
func TestBroadcastReparent(t *testing.T) {
	f := newFleet(t, 6<<20, 2)
	// Chain: owner → h1 (readers 2, 3) → h2 (4, 5) → h3 (6, 7).
	plan := f.owner.ExplainBroadcast(f.src, f.refs())
	require.Equal(t, 2, plan.Nodes[4].Parent, "\n%s", plan)
	require.Equal(t, 4, plan.Nodes[6].Parent, "\n%s", plan)
	before := counter(t, f.rts[0], "tensorlane_broadcast_reroutes_total")
	res := killMidway(t, f, 2)
	for i, rr := range res.Readers {
		if f.slots[i].rt == f.rts[2] {
			assert.ErrorIs(t, rr.Err, ErrReaderDied, "reader %d", i)
			continue
		}
		require.NoError(t, rr.Err, "reader %d", i)
		checkSlot(t, f.slots[i], 0, f.data)
	}
	assert.Equal(t, 6, res.OK())
	assert.Equal(t, 2, res.Readers[6].FedBy, "h3's leader is fed by h1's, the dead reader's parent")
	assert.Equal(t, 4, res.Readers[6].Parent)
	assert.True(t, res.Readers[6].Reparented())
	assert.Equal(t, "reader 2", res.Readers[6].Fed)
	assert.Equal(t, 6, res.Readers[7].FedBy, "its subtree follows it")
	assert.False(t, res.Readers[7].Reparented())
	assert.Contains(t, []string{fabric.RDMA, fabric.TCP}, res.Readers[6].Path)
	assert.Contains(t, res.String(), "reader 6 h3/")
	assert.Contains(t, res.String(), "re-parented; planned under reader 4")
	// One re-parent, or two when h1's forward to h2 failed before h2 was
	// declared dead (the owner then fed reader 4 until it was).
	assert.GreaterOrEqual(t, counter(t, f.rts[0], "tensorlane_broadcast_reroutes_total"), before+1)
}

// A leaf that dies mid-transfer fails alone.
func TestBroadcastDeadLeaf(t *testing.T) {
	f := newFleet(t, 6<<20, 2)
	res := killMidway(t, f, 3) // h3: the last host of the chain
	for i, rr := range res.Readers {
		if f.slots[i].rt == f.rts[3] {
			assert.ErrorIs(t, rr.Err, ErrReaderDied, "reader %d", i)
			continue
		}
		require.NoError(t, rr.Err, "reader %d", i)
		assert.False(t, rr.Reparented())
		checkSlot(t, f.slots[i], 0, f.data)
	}
	assert.Equal(t, 6, res.OK())
	assert.ErrorContains(t, res.Err(), "6 of 8 readers")
}
