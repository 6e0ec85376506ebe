package rdt

import (
	"context"
	"sync/atomic"

	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/tensor"
)

// Async handles: a Get, a batch or a broadcast can start without blocking,
// report its progress in bytes, and be awaited or cancelled (for progress
// bars, the dashboard, and Ray's async fetch hooks). The operation runs
// under the context it was started with; Await's context bounds only the
// wait.

// Progress is how far an operation has come, in bytes.
type Progress struct {
	Done, Total int64
}

// Handle is an operation in flight.
type Handle[T any] struct {
	done     chan struct{}
	cancel   context.CancelFunc
	res      T
	err      error
	progress func() Progress
}

func start[T any](ctx context.Context, f func(ctx context.Context) (T, error)) *Handle[T] {
	ctx, cancel := context.WithCancel(ctx)
	h := &Handle[T]{done: make(chan struct{}), cancel: cancel}
	go func() {
		defer close(h.done)
		defer cancel()
		h.res, h.err = f(ctx)
	}()
	return h
}

// Done is closed when the operation has ended.
func (h *Handle[T]) Done() <-chan struct{} { return h.done }

// Await waits for the operation's result, or for ctx (the operation goes
// on; Cancel stops it).
func (h *Handle[T]) Await(ctx context.Context) (T, error) {
	select {
	case <-h.done:
		return h.res, h.err
	case <-ctx.Done():
		var zero T
		return zero, ctx.Err()
	}
}

// Cancel stops the operation; Await then returns its result (which says it
// was cancelled, unless it had completed). Idempotent.
func (h *Handle[T]) Cancel() { h.cancel() }

// Progress reports the bytes done so far.
func (h *Handle[T]) Progress() Progress {
	if h.progress == nil {
		return Progress{}
	}
	return h.progress()
}

// GetAsync starts a Get. Its progress counts the object when it has landed
// (transports report no partial progress). Release the tensor Await
// returns, also after a Cancel that came too late.
func (a *Actor) GetAsync(ctx context.Context, ref Ref, dst tensor.DeviceID) *Handle[tensor.Tensor] {
	total := spanBytes(ref.Desc)
	var done atomic.Int64
	h := start(ctx, func(ctx context.Context) (tensor.Tensor, error) {
		t, err := a.Get(ctx, ref, dst)
		if err == nil {
			done.Store(total)
		}
		return t, err
	})
	h.progress = func() Progress { return Progress{Done: done.Load(), Total: total} }
	return h
}

// GetBatchAsync starts a GetBatch; its progress counts each object as it
// lands.
func (a *Actor) GetBatchAsync(ctx context.Context, refs []Ref, dst tensor.DeviceID, cfg BatchConfig) *Handle[[]BatchItem] {
	var total int64
	for _, r := range refs {
		total += spanBytes(r.Desc)
	}
	var done atomic.Int64
	cfg.onItem = func(n int64) { done.Add(n) }
	h := start(ctx, func(ctx context.Context) ([]BatchItem, error) { return a.GetBatch(ctx, refs, dst, cfg) })
	h.progress = func() Progress { return Progress{Done: done.Load(), Total: total} }
	return h
}

// StartBroadcast starts a Broadcast; its progress counts bytes the owner
// has written and readers that completed from another reader.
func (a *Actor) StartBroadcast(ctx context.Context, src Ref, slots []Ref, cfg BroadcastConfig) *Handle[*BroadcastResult] {
	var run atomic.Pointer[bcastrun.Run]
	h := start(ctx, func(ctx context.Context) (*BroadcastResult, error) {
		return a.broadcast(ctx, src, slots, cfg, func(b *bcastrun.Run) { run.Store(b) })
	})
	total := spanBytes(src.Desc) * int64(len(slots))
	h.progress = broadcastProgress(h, &run, total)
	return h
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
func broadcastProgress[T deliverer](h *Handle[T], run *atomic.Pointer[bcastrun.Run], total int64) func() Progress {
	return func() Progress {
		b := run.Load()
		if b == nil {
			return Progress{Total: total}
		}
		d, t := b.Progress()
		select {
		case <-h.done:
			if h.err == nil {
				d = h.res.delivered()
			}
		default:
		}
		return Progress{Done: min(d, t), Total: t}
	}
}
