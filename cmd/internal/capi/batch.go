package capi

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// Batches: a state dict is fifty to a few hundred tensors, and the C ABI's
// per-call costs (a cgo crossing, a ref parse, a lease round trip, a grant
// round trip) multiplied by that count were what made a Ray state dict
// slower than Ray's own store. PutBatch publishes many regions in one call;
// GetBatch reads many refs with rdt's GetBatch (one lease request per owner,
// the transfers coalesced per owner and path: one shm frame, one tcp
// pipeline, one rdma registration); ViewBatch maps many refs, several at a
// time, each owner's slab mapped once whatever the count of objects in it.

// maxBatch bounds one batch call, so a hostile count cannot make the
// library allocate without limit before looking at a single item.
const maxBatch = 1 << 16

// viewParallel is how many views of a batch are asked for at once: each is
// a grant round trip to its owner, which overlap well.
const viewParallel = 8

// PutBatch publishes every region (as Put does) and returns their refs in
// order. It is all or nothing: when one region is refused, the objects
// already published by the call are freed and the error names the item.
func (r *Runtime) PutBatch(ctx context.Context, gs []Region) ([][]byte, error) {
	if len(gs) > maxBatch {
		return nil, invalid("batch of %d items (at most %d)", len(gs), maxBatch)
	}
	refs := make([][]byte, 0, len(gs))
	for i, g := range gs {
		ref, err := r.Put(ctx, g)
		if err != nil {
			for _, p := range refs {
				r.Free(ctx, p, time.Second)
			}
			return nil, fmt.Errorf("item %d: %w", i, err)
		}
		refs = append(refs, ref)
	}
	return refs, nil
}

// BatchGot is one item of GetBatch: the address and length of new
// shareable memory holding the tensor (give it back with FreeMemory), or
// why not.
type BatchGot struct {
	Ptr unsafe.Pointer
	N   int64
	Err error
}

// GetBatch reads every ref into new shareable memory, as Get does for one,
// through rdt's batch read: one lease request per owner, and transfers
// coalesced per owner and path. op, when not 0, names the whole batch for
// Cancel. The error is non-nil only when the batch could not run at all
// (closed, a malformed ref, too many items); item errors are in the items,
// and the successful items' memory is the caller's either way.
func (r *Runtime) GetBatch(ctx context.Context, refBytes [][]byte, op uint64, timeout time.Duration) ([]BatchGot, error) {
	if len(refBytes) > maxBatch {
		return nil, invalid("batch of %d items (at most %d)", len(refBytes), maxBatch)
	}
	out := make([]BatchGot, len(refBytes))
	refs := make([]rdt.Ref, 0, len(refBytes))
	idx := make([]int, 0, len(refBytes))
	for i, p := range refBytes {
		ref, err := parseRef(p)
		if err == nil {
			if _, n := spanOf(ref.Desc); n == 0 {
				err = invalid("the object is empty")
			}
		}
		if err != nil {
			out[i].Err = err
			continue
		}
		refs, idx = append(refs, ref), append(idx, i)
	}
	if len(refs) == 0 {
		return out, nil
	}
	ctx, done := r.begin(ctx, op, timeout)
	defer done()
	start := time.Now()
	items, err := r.actor.GetBatch(ctx, refs, tensor.HostDevice, rdt.BatchConfig{})
	if err != nil {
		return nil, err
	}
	for k, it := range items {
		i := idx[k]
		r.count(it.Transfer, start, it.Err)
		if it.Err != nil {
			out[i].Err = it.Err
			continue
		}
		p, n, err := r.adopt(it.Tensor.Buffer())
		if err != nil {
			it.Tensor.Release()
			out[i].Err = err
			continue
		}
		out[i] = BatchGot{Ptr: p, N: n}
	}
	return out, nil
}

// adopt makes a buffer from the runtime's host memory an allocation of the
// caller's, as if Alloc had made it: FreeMemory gives it back, and a Put
// inside it costs no copy.
func (r *Runtime) adopt(buf tensor.Buffer) (unsafe.Pointer, int64, error) {
	p, err := tensor.BytesOf(buf)
	if err != nil {
		return nil, 0, err
	}
	if len(p) == 0 {
		return nil, 0, fmt.Errorf("a received buffer holds no bytes")
	}
	a := &allocation{shared: tensor.NewShared(buf), base: uintptr(unsafe.Pointer(&p[0])), n: int64(len(p))}
	r.mu.Lock()
	r.allocs[a.base] = a
	r.mu.Unlock()
	return unsafe.Pointer(&p[0]), a.n, nil
}

// BatchView is one item of ViewBatch: a view handle for ReleaseView, the
// address of the first byte and the span, or why not.
type BatchView struct {
	View uint64
	Ptr  unsafe.Pointer
	N    int64
	Err  error
}

// ViewBatch maps every ref read-only, as View does for one: the refs are
// leased first with one lease request per owner (rdt.Actor.HoldBatch, as
// GetBatch does; View asked once per ref), then mapped viewParallel at a
// time, each grant on its owner's pooled connection; in slab mode an
// owner's slab is mapped once for all the objects in it. The caller
// Releases each ref when done with it, as after GetBatch. Items that no
// path can map fail with an error matching ErrNoZeroCopy (copy those with
// Get or GetBatch: their lease is held already). op, when not 0, names the
// whole batch for Cancel.
func (r *Runtime) ViewBatch(ctx context.Context, refBytes [][]byte, cfg ViewConfig, op uint64, timeout time.Duration) ([]BatchView, error) {
	if len(refBytes) > maxBatch {
		return nil, invalid("batch of %d items (at most %d)", len(refBytes), maxBatch)
	}
	out := make([]BatchView, len(refBytes))
	if len(refBytes) == 0 {
		return out, nil
	}
	ctx, done := r.begin(ctx, op, timeout)
	defer done()
	// One lease request per owner for the refs of other runtimes.
	var refs []rdt.Ref
	var idx []int
	for i, p := range refBytes {
		if ref, err := parseRef(p); err == nil && ref.Owner != r.rt.ID() {
			refs, idx = append(refs, ref), append(idx, i)
		}
	}
	held := make([]error, len(refBytes))
	if len(refs) > 0 {
		for k, err := range r.actor.HoldBatch(ctx, refs) {
			held[idx[k]] = err
		}
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, viewParallel)
	for i, p := range refBytes {
		if held[i] != nil {
			out[i] = BatchView{Err: held[i]}
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			h, ptr, n, _, err := r.View(ctx, p, cfg, 0, 0) // bounded by the batch's ctx
			out[i] = BatchView{View: h, Ptr: ptr, N: n, Err: err}
		}()
	}
	wg.Wait()
	return out, nil
}
