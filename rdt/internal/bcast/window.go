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
//
// The writes run on at most w goroutines that the window keeps for its
// whole edge, not one per chunk: a chunk's write (plan, push, notice) goes
// deep enough that a fresh goroutine grew its stack on every chunk, which
// took 7% of a broadcast's CPU in 64 KiB chunks.
type Window struct {
	ctx    context.Context
	cancel context.CancelFunc
	places chan struct{}                    // one per write in flight
	jobs   chan func(context.Context) error // to an idle worker
	quit   chan struct{}                    // closed by Wait: the workers end
	ended  sync.Once                        // closes quit
	wg     sync.WaitGroup                   // writes started and not done
	live   sync.WaitGroup                   // workers

	mu      sync.Mutex
	err     error // the first failure while ctx was live
	ok      int   // writes that succeeded
	workers int   // started so far, at most cap(places)
}

// NewWindow returns an edge's window of w writes (at least one) under ctx.
// The caller must call Wait once it sends no more.
func NewWindow(ctx context.Context, w int) *Window {
	ctx, cancel := context.WithCancel(ctx)
	return &Window{ctx: ctx, cancel: cancel, places: make(chan struct{}, max(1, w)),
		jobs: make(chan func(context.Context) error), quit: make(chan struct{})}
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
	select {
	case e.jobs <- write: // an idle worker took it
		return true
	default:
	}
	e.mu.Lock()
	start := e.workers < cap(e.places)
	if start {
		e.workers++
	}
	e.mu.Unlock()
	if start {
		e.live.Add(1)
		go e.work(write)
		return true
	}
	// Every worker is started and this write holds a place, so at most
	// w-1 others run: a worker is idle or about to be.
	e.jobs <- write
	return true
}

// work runs write, then every write handed to it, until Wait ends it.
func (e *Window) work(write func(context.Context) error) {
	defer e.live.Done()
	for {
		e.run(write)
		select {
		case write = <-e.jobs:
		case <-e.quit:
			return
		}
	}
}

// run runs one write, keeps its outcome and frees its place.
func (e *Window) run(write func(context.Context) error) {
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
}

// Done is closed once the edge failed or its ctx ended.
func (e *Window) Done() <-chan struct{} { return e.ctx.Done() }

// Wait waits for every write started (they read the source's memory, which
// must stay pinned until then) and returns the first failure, if any, and
// how many writes succeeded. Its workers have ended when it returns.
func (e *Window) Wait() (ok int, err error) {
	e.wg.Wait()
	e.cancel()
	e.ended.Do(func() { close(e.quit) })
	e.live.Wait()
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.ok, e.err
}
