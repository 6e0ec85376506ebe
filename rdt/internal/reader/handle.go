package reader

import (
	"context"
	"sync/atomic"
)

// Progress is how far an operation has come, in bytes (rdt.Progress).
type Progress struct {
	Done, Total int64
}

// Handle is an operation in flight (rdt.Handle): a Get, a batch or a
// broadcast that started without blocking. The operation runs under the
// context it was started with; Await's context bounds only the wait.
type Handle[T any] struct {
	done     chan struct{}
	cancel   context.CancelFunc
	res      T
	err      error
	progress func(finished bool, res T, err error) Progress
}

// Start runs f in its own goroutine under a child of ctx. progress, if
// set, reports the operation's progress; it is told whether f returned
// and, if so, what.
func Start[T any](ctx context.Context, f func(ctx context.Context) (T, error), progress func(finished bool, res T, err error) Progress) *Handle[T] {
	ctx, cancel := context.WithCancel(ctx)
	h := &Handle[T]{done: make(chan struct{}), cancel: cancel, progress: progress}
	go func() {
		defer close(h.done)
		defer cancel()
		h.res, h.err = f(ctx)
	}()
	return h
}

// Count starts f as Start does, its progress the bytes f says landed of
// total (transports report no partial progress: a read counts when its
// object has landed).
func Count[T any](ctx context.Context, total int64, f func(ctx context.Context, landed func(bytes int64)) (T, error)) *Handle[T] {
	var done atomic.Int64
	return Start(ctx, func(ctx context.Context) (T, error) { return f(ctx, func(n int64) { done.Add(n) }) },
		func(bool, T, error) Progress { return Progress{Done: done.Load(), Total: total} })
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
	select {
	case <-h.done:
		return h.progress(true, h.res, h.err)
	default:
		var zero T
		return h.progress(false, zero, nil)
	}
}
