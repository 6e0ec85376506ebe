package reader

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// Fetch reads ref's tensor into memory on dst for actor a (rdt's Fetch):
// a zero-copy view on the owner's own device, a copy that arrived and
// verified in full everywhere else. The reader never sees a partial
// tensor: on failure the buffer returns to its device before the error
// comes back.
func (r *Reader) Fetch(ctx context.Context, a Actor, ref Ref, dst tensor.DeviceID) (tensor.Tensor, Result, error) {
	done := r.env.Observe(a.Name, ref, r.env.Endpoint(dst))
	t, x, err := r.fetch(ctx, a, ref, dst)
	done(x, err)
	return t, x, err
}

func (r *Reader) fetch(ctx context.Context, a Actor, ref Ref, dst tensor.DeviceID) (tensor.Tensor, Result, error) {
	if r.env.Closed() {
		return tensor.Tensor{}, Result{}, errs.Closed
	}
	if err := a.MayUse(dst); err != nil {
		return tensor.Tensor{}, Result{}, err
	}
	if err := ref.Desc.Validate(); err != nil {
		return tensor.Tensor{}, Result{}, fmt.Errorf("%w: %v", errs.MalformedRef, err)
	}
	ctx, end, err := r.Begin(ctx)
	if err != nil {
		return tensor.Tensor{}, Result{}, err
	}
	defer end()
	ctx, unguard, err := r.Guard(ctx, ref)
	if err != nil {
		return tensor.Tensor{}, Result{}, err
	}
	defer unguard()
	remote := Remote(ref)
	plan := r.d.Planner.PlanRead(remote, r.env.Endpoint(dst)) // what Explain prints
	alloc := func(ctx context.Context, n int64) (tensor.Buffer, error) {
		mem, err := r.env.Memory(dst)
		if err != nil {
			return nil, err
		}
		return mem.Alloc(ctx, n)
	}
	buf, st, err := r.d.Planner.Fetch(ctx, &plan, remote, alloc)
	if err != nil {
		// The owner's death cancels ctx: Why says so, not "context canceled".
		return tensor.Tensor{}, Result{Plan: plan}, r.Why(ctx, ref, err)
	}
	desc := ref.Desc.Rebased()
	if st.ZeroCopy {
		desc = ref.Desc // the owner's own buffer: the view keeps its offset
	}
	out, err := tensor.New(buf, desc)
	if err != nil {
		buf.Release()
		return tensor.Tensor{}, Result{Plan: plan}, err
	}
	return out, Result{Plan: plan, Stats: st}, nil
}

// Into reads ref's tensor into dst, a contiguous tensor at the start of
// its buffer with room for it (rdt's GetInto). After an error dst's
// contents are undefined.
func (r *Reader) Into(ctx context.Context, a Actor, ref Ref, dst tensor.Tensor) (Result, error) {
	done := r.env.Observe(a.Name, ref, r.env.Endpoint(dst.Device()))
	x, err := r.into(ctx, a, ref, dst)
	done(x, err)
	return x, err
}

func (r *Reader) into(ctx context.Context, a Actor, ref Ref, dst tensor.Tensor) (Result, error) {
	if r.env.Closed() {
		return Result{}, errs.Closed
	}
	if !dst.Valid() {
		return Result{}, fmt.Errorf("%w: empty destination", tensor.ErrBadDesc)
	}
	if err := a.MayUse(dst.Device()); err != nil {
		return Result{}, err
	}
	if err := ref.Desc.Validate(); err != nil {
		return Result{}, fmt.Errorf("%w: %v", errs.MalformedRef, err)
	}
	remote := Remote(ref)
	if !dst.Desc().Contiguous() {
		return Result{}, fmt.Errorf("%w: destination must be contiguous", tensor.ErrBadDesc)
	}
	if start, end := dst.Desc().Span(); end-start < remote.Length {
		return Result{}, fmt.Errorf("%w: destination holds %d bytes, the object has %d", tensor.ErrTooSmall, end-start, remote.Length)
	}
	if start, _ := dst.Desc().Span(); start != 0 {
		return Result{}, fmt.Errorf("%w: destination must start at its buffer's beginning", tensor.ErrBadDesc)
	}
	ctx, end, err := r.Begin(ctx)
	if err != nil {
		return Result{}, err
	}
	defer end()
	ctx, unguard, err := r.Guard(ctx, ref)
	if err != nil {
		return Result{}, err
	}
	defer unguard()
	st, plan, err := r.d.Planner.Read(ctx, remote, r.env.Endpoint(dst.Device()), dst.Buffer())
	if err != nil {
		return Result{Plan: plan}, r.Why(ctx, ref, err)
	}
	return Result{Plan: plan, Stats: st}, nil
}

// Item is one ref's outcome in a batch.
type Item struct {
	Tensor tensor.Tensor // valid when Err is nil
	Result Result
	Err    error
}

// Batch tunes a batch (rdt.BatchConfig).
type Batch struct {
	// Parallel is how many transfers run at once (those a path does not
	// coalesce); at least 1.
	Parallel int
	// Separate moves every object on its own, as if no path could coalesce.
	Separate bool
	// OnItem, if set, is told the bytes of each object that landed.
	OnItem func(bytes int64)
}

// owner names one life of another runtime.
type owner struct {
	id  peer.ID
	inc uint64
}

// GetBatch reads every ref onto dst for a (which may use dst): it holds
// them all with one lease round trip per owner (HoldBatch), then hands
// each owner's refs to the planner together, which coalesces the
// transfers per path and moves the rest cfg.Parallel at a time; this
// runtime's own refs (and every ref, with cfg.Separate) are Fetched one by
// one, largest first. Each item reports its own outcome.
func (r *Reader) GetBatch(ctx context.Context, a Actor, refs []Ref, dst tensor.DeviceID, cfg Batch) []Item {
	items := make([]Item, len(refs))
	held := r.HoldBatch(ctx, a.Name, refs)
	owners := map[owner][]int{}
	var keys []owner
	order := make([]int, 0, len(refs))
	for i, err := range held {
		if err != nil {
			items[i].Err = err
			continue
		}
		if ref := refs[i]; !r.own(ref) && !cfg.Separate {
			k := owner{ref.Owner, ref.Incarnation}
			if owners[k] == nil {
				keys = append(keys, k)
			}
			owners[k] = append(owners[k], i)
			continue
		}
		order = append(order, i)
	}
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.fetchOwner(ctx, a, refs, owners[k], dst, items, cfg)
		}()
	}
	sort.SliceStable(order, func(x, y int) bool { return Bytes(refs[order[x]].Desc) > Bytes(refs[order[y]].Desc) })
	sem := make(chan struct{}, cfg.Parallel)
	for _, i := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			t, x, err := r.Fetch(ctx, a, refs[i], dst)
			items[i] = Item{Tensor: t, Result: x, Err: err}
			if err == nil && cfg.OnItem != nil {
				cfg.OnItem(Bytes(refs[i].Desc))
			}
		}()
	}
	wg.Wait()
	return items
}

// fetchOwner fetches refs[idx...], all owned by one incarnation of another
// runtime and held already, onto dst, and fills in their items. Each item
// is its own transfer record; Stats.Coalesced says how many moved together.
func (r *Reader) fetchOwner(ctx context.Context, a Actor, refs []Ref, idx []int, dst tensor.DeviceID, items []Item, cfg Batch) {
	fail := func(err error, idx []int) {
		for _, i := range idx {
			items[i].Err = err
		}
	}
	ctx, end, err := r.Begin(ctx)
	if err != nil {
		fail(err, idx)
		return
	}
	defer end()
	// One watch for the owner: its death fails every item still moving.
	ctx, stop := r.watch(ctx, refs[idx[0]], "a batch waited on it")
	defer stop()
	// Each item's Get use of its lease (no round trip: the batch holds it).
	var live []int
	for _, i := range idx {
		if err := r.Hold(ctx, "", refs[i]); err != nil {
			items[i].Err = r.Why(ctx, refs[i], err)
			continue
		}
		live = append(live, i)
	}
	defer func() {
		for _, i := range live {
			r.unget(refs[i])
		}
	}()
	mem, err := r.env.Memory(dst)
	if err != nil {
		fail(err, live)
		return
	}
	dstEp := r.env.Endpoint(dst)
	srcs := make([]fabric.Remote, 0, len(live))
	bufs := make([]tensor.Buffer, 0, len(live))
	moving := make([]int, 0, len(live))
	dones := make([]func(Result, error), 0, len(live))
	for _, i := range live {
		ref := refs[i]
		done := r.env.Observe(a.Name, ref, dstEp)
		remote := Remote(ref)
		buf, err := mem.Alloc(ctx, remote.Length)
		if err != nil {
			items[i].Err = r.Why(ctx, ref, err)
			done(Result{}, items[i].Err)
			continue
		}
		srcs, bufs = append(srcs, remote), append(bufs, buf)
		moving, dones = append(moving, i), append(dones, done)
	}
	res := r.d.Planner.ReadBatch(ctx, srcs, dstEp, bufs, cfg.Parallel)
	for k, i := range moving {
		ref := refs[i]
		x := Result{Plan: res[k].Plan, Stats: res[k].Stats}
		err := res[k].Err
		var out tensor.Tensor
		if err == nil {
			out, err = tensor.New(bufs[k], ref.Desc.Rebased())
		}
		if err != nil {
			// The reader never sees a partial tensor.
			bufs[k].Release()
			err = r.Why(ctx, ref, err)
			items[i] = Item{Result: x, Err: err}
		} else {
			items[i] = Item{Tensor: out, Result: x}
			if cfg.OnItem != nil {
				cfg.OnItem(Bytes(ref.Desc))
			}
		}
		dones[k](x, err)
	}
}
