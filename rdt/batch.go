package rdt

import (
	"context"
	"fmt"
	"sync"

	"github.com/tensorlane/tensorlane/rdt/internal/reader"
	"github.com/tensorlane/tensorlane/tensor"
)

// Batches: a state dict is hundreds of tensors. GetBatch takes the holds on
// all of them with one lease round trip per owner (not one per tensor), then
// hands each owner's refs to the planner together, which coalesces the
// transfers per path (tcp pipelines them, rdma registers them all in one
// round trip; batchread.go) and moves the rest a few at a time; the runtime
// renews all the leases in one request per owner as it does every lease. Each item reports its own outcome: a batch that
// mixes valid and freed refs gets the valid tensors and, for the others, why.

// BatchConfig tunes a batch; the zero value means the defaults.
type BatchConfig struct {
	// Parallel is how many transfers run at once (those a path does not
	// coalesce). Default 4.
	Parallel int
	// Separate moves every object on its own, Parallel at a time, as if no
	// path could coalesce: for comparisons (bench statedict).
	Separate bool

	onItem func(bytes int64) // progress (async.go)
}

// BatchItem is one ref's outcome in a batch.
type BatchItem struct {
	Tensor   tensor.Tensor // valid when Err is nil; release it when done
	Transfer Transfer
	Err      error
}

// GetBatch fetches every ref onto dst. The error is non-nil only when the
// batch as a whole could not run (runtime closed, device not the actor's,
// ctx done before it began); per-ref failures are in the items.
func (a *Actor) GetBatch(ctx context.Context, refs []Ref, dst tensor.DeviceID, cfg BatchConfig) ([]BatchItem, error) {
	if a.rt.isClosed() {
		return nil, ErrClosed
	}
	if err := a.mayUse(dst); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 4
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	res := a.rt.reader.GetBatch(ctx, a.who(), wireRefs(refs), dst, reader.Batch{Parallel: cfg.Parallel, Separate: cfg.Separate, OnItem: cfg.onItem})
	items := make([]BatchItem, len(res))
	for i, it := range res {
		items[i] = BatchItem{Tensor: it.Tensor, Transfer: transfer(it.Result), Err: it.Err}
	}
	return items, nil
}

// ReleaseBatch releases the tensors of a batch's items that have one.
func ReleaseBatch(items []BatchItem) {
	for _, it := range items {
		if it.Err == nil && it.Tensor.Valid() {
			it.Tensor.Release()
		}
	}
}

// HoldBatch is Hold for many refs at once: one lease request per owner
// (per ctlwire.MaxClaims refs) for the refs this runtime does not hold yet, where
// Hold asks once per ref. errs[i] is ref i's outcome; a held ref is
// Released as after Hold. A batch of Views (the C ABI's ViewBatch) holds
// its refs with it first, so each View's own lease costs no round trip.
func (a *Actor) HoldBatch(ctx context.Context, refs []Ref) []error {
	if a.rt.isClosed() {
		errs := make([]error, len(refs))
		for i := range errs {
			errs[i] = ErrClosed
		}
		return errs
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	return a.rt.reader.HoldBatch(ctx, a.name, wireRefs(refs))
}

// PushBatch pushes srcs[i] into the slot dsts[i] names for every i and
// returns each push's outcome. The writes move coalesced per (path,
// destination runtime) where the path can (tcp, rdma; Transfer.Stats.Coalesced
// says how many moved together), the rest Parallel at a time, and each
// destination runtime hears of all its completed pushes in one notice
// (Transfer.Notified; pushbatch.go). A slot named twice, a source this
// runtime does not own, or a size mismatch fails that item alone; a failed
// item does not advance its slot's generation. cfg.Separate pushes every
// item on its own with Push instead, for comparisons.
func (a *Actor) PushBatch(ctx context.Context, srcs, dsts []Ref, cfg BatchConfig) ([]Transfer, []error) {
	xs := make([]Transfer, len(srcs))
	errs := make([]error, len(srcs))
	if len(srcs) != len(dsts) {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %d sources for %d slots", ErrMalformedRef, len(srcs), len(dsts))
		}
		return xs, errs
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 4
	}
	if !cfg.Separate {
		return a.pushBatch(ctx, srcs, dsts, cfg)
	}
	sem := make(chan struct{}, cfg.Parallel)
	var wg sync.WaitGroup
	for i := range srcs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			xs[i], errs[i] = a.Push(ctx, srcs[i], dsts[i])
		}()
	}
	wg.Wait()
	return xs, errs
}
