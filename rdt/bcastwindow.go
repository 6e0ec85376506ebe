package rdt

import (
	"context"
	"sync"
)

// An edge of a broadcast tree (the owner feeding a reader, or a reader
// forwarding to a child) writes chunks, each a push plus a notice round
// trip. One chunk at a time would leave the edge idle for that round trip
// between chunks; an edgeWindow keeps up to BroadcastConfig.Window of them
// in flight instead. Chunks may land out of order: a relay counts them in
// a bitmap and completes only when every one has landed.

// MaxBroadcastWindow bounds BroadcastConfig.Window: past a few chunks the
// edge is full, and each chunk in flight holds a notice stream (a slot
// runtime keeps 8 idle ones per writer) and a transport connection.
const MaxBroadcastWindow = 16

// defaultWindow is BroadcastConfig.Window's default.
const defaultWindow = 4

// edgeWindow runs the chunk writes of one edge, up to w at once. The first
// failure cancels the edge's other writes and is the one reported.
type edgeWindow struct {
	ctx    context.Context
	cancel context.CancelFunc
	places chan struct{}
	wg     sync.WaitGroup

	mu  sync.Mutex
	err error // the first failure while ctx was live
	ok  int   // writes that succeeded
}

func newEdgeWindow(ctx context.Context, w int) *edgeWindow {
	ctx, cancel := context.WithCancel(ctx)
	return &edgeWindow{ctx: ctx, cancel: cancel, places: make(chan struct{}, max(1, w))}
}

// send starts write once the window has room. It returns false, and starts
// nothing, when the edge has failed or ctx has ended: the caller stops.
func (e *edgeWindow) send(write func(ctx context.Context) error) bool {
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

// done is closed once the edge failed or its ctx ended.
func (e *edgeWindow) done() <-chan struct{} { return e.ctx.Done() }

// wait waits for every write started (they read the source's memory, which
// must stay pinned until then) and returns the first failure, if any, and
// how many writes succeeded.
func (e *edgeWindow) wait() (ok int, err error) {
	e.wg.Wait()
	e.cancel()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ok, e.err
}
