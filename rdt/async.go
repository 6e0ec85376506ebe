package rdt

import (
	"context"
	"sync/atomic"

	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/reader"
	"github.com/tensorlane/tensorlane/tensor"
)

// Async handles: a Get, a batch or a broadcast can start without blocking,
// report its progress in bytes, and be awaited or cancelled (for progress
// bars, the dashboard, and Ray's async fetch hooks). The operation runs
// under the context it was started with; Await's context bounds only the
// wait.

// Progress is how far an operation has come, in bytes.
type Progress = reader.Progress

// Handle is an operation in flight: Done, Await, Cancel and Progress.
type Handle[T any] = reader.Handle[T]

// GetAsync starts a Get. Its progress counts the object when it has landed
// (transports report no partial progress). Release the tensor Await
// returns, also after a Cancel that came too late.
func (a *Actor) GetAsync(ctx context.Context, ref Ref, dst tensor.DeviceID) *Handle[tensor.Tensor] {
	total := spanBytes(ref.Desc)
	return reader.Count(ctx, total, func(ctx context.Context, landed func(int64)) (tensor.Tensor, error) {
		t, err := a.Get(ctx, ref, dst)
		if err == nil {
			landed(total)
		}
		return t, err
	})
}

// GetBatchAsync starts a GetBatch; its progress counts each object as it
// lands.
func (a *Actor) GetBatchAsync(ctx context.Context, refs []Ref, dst tensor.DeviceID, cfg BatchConfig) *Handle[[]BatchItem] {
	var total int64
	for _, r := range refs {
		total += spanBytes(r.Desc)
	}
	return reader.Count(ctx, total, func(ctx context.Context, landed func(int64)) ([]BatchItem, error) {
		cfg.onItem = landed
		return a.GetBatch(ctx, refs, dst, cfg)
	})
}

// StartBroadcast starts a Broadcast; its progress counts bytes the owner
// has written and readers that completed from another reader.
func (a *Actor) StartBroadcast(ctx context.Context, src Ref, slots []Ref, cfg BroadcastConfig) *Handle[*BroadcastResult] {
	var run atomic.Pointer[bcastrun.Run]
	total := spanBytes(src.Desc) * int64(len(slots))
	return reader.Start(ctx, func(ctx context.Context) (*BroadcastResult, error) {
		return a.broadcast(ctx, src, slots, cfg, func(b *bcastrun.Run) { run.Store(b) })
	}, broadcastProgress[*BroadcastResult](&run, total))
}

// deliverer is a broadcast result: the bytes it delivered, all readers
// together (a nil result delivered nothing).
type deliverer interface{ delivered() int64 }

func (r *BroadcastResult) delivered() int64 {
	if r == nil {
		return 0
	}
	return r.Bytes * int64(r.OK())
}

// broadcastProgress reports a broadcast handle's progress: the run's count
// while it runs, what its result says once it is done.
func broadcastProgress[T deliverer](run *atomic.Pointer[bcastrun.Run], total int64) func(bool, T, error) Progress {
	return func(finished bool, res T, err error) Progress {
		b := run.Load()
		if b == nil {
			return Progress{Total: total}
		}
		d, t := b.Progress()
		if finished && err == nil {
			d = res.delivered()
		}
		return Progress{Done: min(d, t), Total: t}
	}
}
