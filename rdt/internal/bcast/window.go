package bcast

import (
	"context"
	"sync"
)

// An edge of a broadcast tree (the owner feeding a reader, or a reader
// forwarding to a child) writes chunks, each a push plus a notice round
// trip. One chunk at a time would leave the edge idle for that round trip
// between chunks; a Window keeps up to Config.Window of them in flight
// instead. Chunks may land out of order: a relay counts them in a bitmap
// and completes only when every one has landed.

// Window runs the chunk writes of one edge, up to w at once. The first
// failure cancels the edge's other writes and is the one reported.
type Window struct {
	ctx    context.Context
	cancel context.CancelFunc
	places chan struct{}
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error // the first failure while ctx was live
	ok  int   // writes that succeeded
}

// NewWindow returns an edge's window of w writes (at least one) under ctx.
// The caller must call Wait once it sends no more.
func NewWindow(ctx context.Context, w int) *Window {
	ctx, cancel := context.WithCancel(ctx)
	return &Window{ctx: ctx, cancel: cancel, places: make(chan struct{}, max(1, w))}
}

// Send starts write once the window has room. It returns false, and starts
// nothing, when the edge has failed or ctx has ended: the caller stops.
func (e *Window) Send(write func(ctx context.Context) error) bool {
	select {
	case e.places <- struct{}{}:
	case <-e.ctx.Done():
		return false
	}
	if e.ctx.Err() != nil { // both were ready: do not start past a failure
		<-e.places
		return false
	}
	e.wg.Add(1)
	go func() {
		defer e.wg.Done()
		err := write(e.ctx)
		e.mu.Lock()
		if err == nil {
			e.ok++
		} else if e.err == nil && e.ctx.Err() == nil {
			e.err = err
		}
		e.mu.Unlock()
		if err != nil {
			e.cancel()
		}
		<-e.places
	}()
	return true
}

// Done is closed once the edge failed or its ctx ended.
func (e *Window) Done() <-chan struct{} { return e.ctx.Done() }

// Wait waits for every write started (they read the source's memory, which
// must stay pinned until then) and returns the first failure, if any, and
// how many writes succeeded.
func (e *Window) Wait() (ok int, err error) {
	e.wg.Wait()
	e.cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ok, e.err
}
