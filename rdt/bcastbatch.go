package rdt

import (
	"context"
	"sync/atomic"

	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/reader"
)

// BroadcastBatch sends a set of objects (a state dict) to many readers
// along one tree: readers[j] lists reader j's slots, one per object of
// srcs in order (all on one runtime and device). Each reader is prepared
// once for the whole set, the objects flow as one stream of chunks, and a
// reader forwards each chunk as it lands, so the tree is set up once and
// pipelined across objects rather than once per tensor. Each of a reader's
// slots completes (Slot.Wait returns) as soon as its object has landed.
//
// An object that cannot be sent (freed, not this runtime's) is left out:
// its error is in the result's Items, the rest are sent. A reader whose
// slots do not all fit (closed, wrong size, busy) gets none of the batch
// and its ReaderResult says why. The error is non-nil only when nothing
// could start.
func (a *Actor) BroadcastBatch(ctx context.Context, srcs []Ref, readers [][]Ref, cfg BroadcastConfig) (*BatchBroadcastResult, error) {
	return a.StartBroadcastBatch(ctx, srcs, readers, cfg).Await(ctx)
}

// BatchBroadcastResult is a BroadcastBatch's outcome: per reader (its
// ReaderResults have Slots and Generations per object) and per object.
type BatchBroadcastResult struct {
	*BroadcastResult
	// Items holds, per object of srcs, nil when it was sent, else why it
	// was left out of the batch.
	Items []error
}

// StartBroadcastBatch starts a BroadcastBatch.
func (a *Actor) StartBroadcastBatch(ctx context.Context, srcs []Ref, readers [][]Ref, cfg BroadcastConfig) *Handle[*BatchBroadcastResult] {
	var run atomic.Pointer[bcastrun.Run]
	var total int64
	for _, s := range srcs {
		total += spanBytes(s.Desc)
	}
	total *= int64(len(readers))
	return reader.Start(ctx, func(ctx context.Context) (*BatchBroadcastResult, error) {
		res, items, err := a.broadcastSet(ctx, srcs, readers, cfg, func(b *bcastrun.Run) { run.Store(b) })
		if err != nil {
			return nil, err
		}
		return &BatchBroadcastResult{BroadcastResult: res, Items: items}, nil
	}, broadcastProgress[*BatchBroadcastResult](&run, total))
}

func (r *BatchBroadcastResult) delivered() int64 {
	if r == nil {
		return 0
	}
	return r.BroadcastResult.delivered()
}
