package capi

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"
	"unsafe"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
)

// runtimes starts one runtime per config in one Library.
func runtimes(t *testing.T, configs ...string) []*Runtime {
	t.Helper()
	t.Setenv(fabric.EnvTransports, "")
	t.Setenv(EnvClusterKey, "")
	t.Setenv(EnvSlabs, "")
	t.Setenv(EnvPoolBytes, "")
	ctx := context.Background()
	lib := New()
	t.Cleanup(func() { require.NoError(t, lib.CloseAll(context.Background())) })
	var out []*Runtime
	for _, c := range configs {
		h, err := lib.NewRuntime(ctx, []byte(c))
		require.NoError(t, err)
		r, err := lib.Runtime(h)
		require.NoError(t, err)
		out = append(out, r)
	}
	return out
}

func kindOf(err error) string { return Kinds[Code(err)] }

// TestReserveLandings: a slot over the reader's own foreign memory is
// staged when shm may write it (the caller's bytes change only inside
// SlotWait), in place when only network paths can (tcp), and in place over
// shareable memory from Alloc; pushes land whole in each.
func TestReserveLandings(t *testing.T) {
	for _, tc := range []struct {
		name, config, landing, transport string
		alloc                            bool
	}{
		{"shm, foreign memory: staged", `{"allow":["shm"]}`, LandStaged, "shm", false},
		{"shm, shareable memory: in place", `{"allow":["shm"]}`, LandInPlace, "shm", true},
		{"tcp, foreign memory: in place", `{"allow":["tcp"]}`, LandInPlace, "tcp", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			rs := runtimes(t, tc.config, tc.config)
			owner, reader := rs[0], rs[1]
			src := pattern(3 << 20)
			ref, err := owner.Put(ctx, Region{Mem: src, DType: "float32", Shape: []int64{3 << 18}})
			require.NoError(t, err)
			var user []byte
			if tc.alloc {
				p, err := reader.Alloc(ctx, int64(len(src)))
				require.NoError(t, err)
				user = unsafe.Slice((*byte)(p), len(src))
			} else {
				user = make([]byte, len(src))
			}
			h, slotRef, err := reader.Reserve(ctx, Region{Mem: user, DType: "float32", Shape: []int64{3 << 18}}, SlotGenerations)
			require.NoError(t, err)
			info, err := reader.SlotInfo(h)
			require.NoError(t, err)
			assert.Equal(t, tc.landing, info.Landing)

			x, err := owner.Push(ctx, ref, slotRef, 5*time.Second)
			require.NoError(t, err)
			assert.Equal(t, tc.transport, x.Transport)
			if tc.landing == LandStaged {
				assert.False(t, bytes.Equal(src, user), "a staged slot's bytes reach the caller's memory only at wait")
			}
			gen, err := reader.SlotWait(ctx, h, 0, 5*time.Second)
			require.NoError(t, err)
			assert.Equal(t, uint64(1), gen)
			assert.True(t, bytes.Equal(src, user), "generation 1 is in the caller's memory")

			// Flow control: the next push is refused until done.
			_, err = owner.Push(ctx, ref, slotRef, 5*time.Second)
			assert.Equal(t, "slot_busy", kindOf(err), "%v", err)
			require.NoError(t, reader.SlotDone(ctx, h, 1))
			_, err = owner.Push(ctx, ref, slotRef, 5*time.Second)
			require.NoError(t, err)
			gen, err = reader.SlotWait(ctx, h, 1, 5*time.Second)
			require.NoError(t, err)
			assert.Equal(t, uint64(2), gen)

			require.NoError(t, reader.SlotClose(h))
			require.NoError(t, reader.SlotClose(h), "closing twice")
			_, err = reader.SlotWait(ctx, h, 0, time.Second)
			assert.Equal(t, "invalid_argument", kindOf(err))
			_, err = owner.Push(ctx, ref, slotRef, 5*time.Second)
			assert.Equal(t, "object_not_found", kindOf(err), "%v", err)
		})
	}
}

// TestBroadcastOperation: a state dict of three tensors broadcast to three
// readers (two on another host, over tcp, one on the owner's, over shm) as
// an asynchronous operation: progress, result per reader, the bytes in
// every reader's own memory, then done and wait-consumed; a second
// broadcast into slots not yet done comes back per reader as slot_busy.
func TestBroadcastOperation(t *testing.T) {
	ctx := context.Background()
	h0 := `{"preset":"dgx-h100","hosts":2,"host":"h0","allow":["shm","tcp"]}`
	h1 := `{"preset":"dgx-h100","hosts":2,"host":"h1","allow":["shm","tcp"]}`
	rs := runtimes(t, h0, h1, h1, h0)
	owner := rs[0]
	shapes := [][]int64{{1 << 18}, {300, 7}, {5 << 16}}
	var srcs [][]byte
	var want [][]byte
	for i, sh := range shapes {
		n := int(sh[0]) * 4
		if len(sh) == 2 {
			n = int(sh[0]*sh[1]) * 4
		}
		p := pattern(n)
		p[0] = byte(i)
		ref, err := owner.Put(ctx, Region{Mem: p, DType: "float32", Shape: sh})
		require.NoError(t, err)
		srcs, want = append(srcs, ref), append(want, p)
	}
	type reader struct {
		rt    *Runtime
		slots []uint64
		mem   [][]byte
	}
	var readers []reader
	var slotRefs [][][]byte
	for _, r := range rs[1:] {
		rd := reader{rt: r}
		var refs [][]byte
		for i, sh := range shapes {
			m := make([]byte, len(want[i]))
			h, ref, err := r.Reserve(ctx, Region{Mem: m, DType: "float32", Shape: sh}, SlotGenerations)
			require.NoError(t, err)
			rd.slots, rd.mem, refs = append(rd.slots, h), append(rd.mem, m), append(refs, ref)
		}
		readers, slotRefs = append(readers, rd), append(slotRefs, refs)
	}
	req, err := json.Marshal(BroadcastRequest{Srcs: srcs, Readers: slotRefs, ChunkSize: 64 << 10, BusyWaitMS: 200})
	require.NoError(t, err)
	plan, err := owner.ExplainBroadcast(req)
	require.NoError(t, err)
	require.Len(t, plan.Nodes, 3)
	t.Logf("plan:\n%s", plan.Text)

	op, err := owner.StartBroadcast(ctx, req, 10*time.Second)
	require.NoError(t, err)
	res, err := owner.OpWait(ctx, op, 10*time.Second)
	require.NoError(t, err)
	info := res.(BroadcastInfo)
	assert.Equal(t, 3, info.OK, "%s", info.Tree)
	prog, finished, err := owner.OpProgress(op)
	require.NoError(t, err)
	assert.True(t, finished)
	var total int64
	for _, w := range want {
		total += int64(len(w))
	}
	assert.Equal(t, total*3, prog.Total)
	assert.Equal(t, prog.Total, prog.Done)
	for j, rd := range readers {
		assert.Empty(t, info.Readers[j].Kind)
		assert.Equal(t, []uint64{1, 1, 1}, info.Readers[j].Generations)
		for k, h := range rd.slots {
			gen, err := rd.rt.SlotWait(ctx, h, 0, 5*time.Second)
			require.NoError(t, err)
			assert.Equal(t, uint64(1), gen)
			assert.True(t, bytes.Equal(want[k], rd.mem[k]), "reader %d object %d", j, k)
		}
	}

	// Not done yet: a second broadcast finds every slot busy.
	op2, err := owner.StartBroadcast(ctx, req, 10*time.Second)
	require.NoError(t, err)
	res2, err := owner.OpWait(ctx, op2, 10*time.Second)
	require.NoError(t, err)
	for j, rr := range res2.(BroadcastInfo).Readers {
		assert.Equal(t, "slot_busy", rr.Kind, "reader %d: %s", j, rr.Message)
	}
	require.NoError(t, owner.OpClose(op2))

	// The readers say done; the first operation's consumers are all in.
	for _, rd := range readers {
		for _, h := range rd.slots {
			require.NoError(t, rd.rt.SlotDone(ctx, h, 1))
		}
	}
	require.NoError(t, owner.OpWaitConsumed(ctx, op, 5*time.Second))
	require.NoError(t, owner.WaitConsumed(ctx, slotRefs[0][0], 1, 5*time.Second))
	require.NoError(t, owner.OpClose(op))
	require.NoError(t, owner.OpClose(op), "closing twice")
	_, _, err = owner.OpProgress(op)
	assert.Equal(t, "invalid_argument", kindOf(err))
}

// TestPushBatchItems: a batch reports each item on its own; bad requests
// are refused whole, typed.
func TestPushBatchItems(t *testing.T) {
	ctx := context.Background()
	rs := runtimes(t, `{"allow":["tcp"]}`, `{"allow":["tcp"]}`)
	owner, reader := rs[0], rs[1]
	var srcs, dsts [][]byte
	var mems [][]byte
	var wants [][]byte
	for i := range 4 {
		p := pattern(4096 * (i + 1))
		ref, err := owner.Put(ctx, Region{Mem: p, DType: "uint8", Shape: []int64{int64(len(p))}})
		require.NoError(t, err)
		m := make([]byte, len(p))
		_, sref, err := reader.Reserve(ctx, Region{Mem: m, DType: "uint8", Shape: []int64{int64(len(p))}}, 0)
		require.NoError(t, err)
		srcs, dsts, mems, wants = append(srcs, ref), append(dsts, sref), append(mems, m), append(wants, p)
	}
	dsts[3] = dsts[2] // one slot twice: the second is refused, and item 3's size differs anyway
	req, _ := json.Marshal(PushBatchRequest{Srcs: srcs, Dsts: dsts})
	items, err := owner.PushBatch(ctx, req, 5*time.Second)
	require.NoError(t, err)
	require.Len(t, items, 4)
	for i := range 3 {
		assert.Empty(t, items[i].Kind, "item %d: %s", i, items[i].Message)
		assert.Equal(t, "tcp", items[i].Transport)
		assert.True(t, bytes.Equal(wants[i], mems[i]))
	}
	assert.NotEmpty(t, items[3].Kind)

	for _, bad := range []string{`{}`, `{"srcs":[],"dsts":[]}`, `{"srcs":["AAAA"],"dsts":["AAAA"]}`, `{"nope":1}`, `not json`} {
		_, err := owner.PushBatch(ctx, []byte(bad), time.Second)
		assert.NotZero(t, Code(err), bad)
		_, err = owner.StartBroadcast(ctx, []byte(bad), time.Second)
		assert.NotZero(t, Code(err), bad)
	}
	_, _, err = reader.Reserve(ctx, Region{Mem: make([]byte, 8), DType: "uint8", Shape: []int64{8}}, 1<<7)
	assert.Equal(t, "invalid_argument", kindOf(err))
	_, _, err = reader.Reserve(ctx, Region{Mem: make([]byte, 8), DType: "uint8", Shape: []int64{9}}, 0)
	assert.Equal(t, "invalid_argument", kindOf(err))
	for _, f := range []func() error{
		func() error { return reader.SlotDone(ctx, 999, 1) },
		func() error { _, err := reader.SlotInfo(999); return err },
		func() error { return reader.OpCancel(999) },
		func() error { _, err := reader.OpWait(ctx, 999, time.Second); return err },
	} {
		assert.Equal(t, "invalid_argument", kindOf(f()))
	}
	assert.NoError(t, reader.OpClose(999), "closing what is gone is not an error")
}

// TestPushStateEndsWithRuntime: closing the runtime closes its slots and
// operations, and the goroutine that watched for it ends (TestMain's
// goleak check sees the rest).
func TestPushStateEndsWithRuntime(t *testing.T) {
	ctx := context.Background()
	t.Setenv(fabric.EnvTransports, "")
	lib := New()
	h, err := lib.NewRuntime(ctx, []byte(`{"allow":["tcp"]}`))
	require.NoError(t, err)
	r, err := lib.Runtime(h)
	require.NoError(t, err)
	_, _, err = r.Reserve(ctx, Region{Mem: make([]byte, 64), DType: "uint8", Shape: []int64{64}}, 0)
	require.NoError(t, err)
	require.NoError(t, lib.Close(ctx, h))
	require.Eventually(t, func() bool { _, ok := pushStates.Load(r); return !ok }, 10*time.Second, 10*time.Millisecond)
}

// TestSlotsWaitAllOrNothing: a set of staged slots lands together: while
// one has not received its generation, waiting for the set fails and no
// caller memory changes; once all have, all land.
func TestSlotsWaitAllOrNothing(t *testing.T) {
	ctx := context.Background()
	rs := runtimes(t, `{"allow":["shm"]}`, `{"allow":["shm"]}`)
	owner, reader := rs[0], rs[1]
	var srcs, slotRefs [][]byte
	var hs []uint64
	var users, wants [][]byte
	for i := range 2 {
		p := pattern(1<<16 + i)
		ref, err := owner.Put(ctx, Region{Mem: p, DType: "uint8", Shape: []int64{int64(len(p))}})
		require.NoError(t, err)
		u := make([]byte, len(p))
		h, sref, err := reader.Reserve(ctx, Region{Mem: u, DType: "uint8", Shape: []int64{int64(len(p))}}, SlotGenerations)
		require.NoError(t, err)
		info, _ := reader.SlotInfo(h)
		require.Equal(t, LandStaged, info.Landing)
		srcs, slotRefs, hs, users, wants = append(srcs, ref), append(slotRefs, sref), append(hs, h), append(users, u), append(wants, p)
	}
	_, err := owner.Push(ctx, srcs[0], slotRefs[0], 5*time.Second)
	require.NoError(t, err)
	_, err = reader.SlotsWait(ctx, hs, []uint64{0, 0}, 100*time.Millisecond)
	assert.Equal(t, "timeout", kindOf(err), "%v", err)
	assert.Equal(t, make([]byte, len(users[0])), users[0], "slot 0 arrived, but the set did not: nothing landed")
	_, err = owner.Push(ctx, srcs[1], slotRefs[1], 5*time.Second)
	require.NoError(t, err)
	gens, err := reader.SlotsWait(ctx, hs, []uint64{0, 0}, 5*time.Second)
	require.NoError(t, err)
	assert.Equal(t, []uint64{1, 1}, gens)
	for i := range users {
		assert.True(t, bytes.Equal(wants[i], users[i]), "slot %d", i)
	}
	_, err = reader.SlotsWait(ctx, hs, []uint64{0}, time.Second)
	assert.Equal(t, "invalid_argument", kindOf(err))
}
