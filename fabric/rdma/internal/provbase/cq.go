package provbase

import (
	"context"
	"sync"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// Completions is a completion queue's list of ready completions with its
// completion channel (ibv_comp_channel): Push appends and wakes a waiter,
// Poll takes. Its zero value is empty and open. A software provider's
// completion queue is just this; a hardware one moves what it reads from
// the device here.
type Completions struct {
	mu     sync.Mutex // a leaf
	q      []rdma.Completion
	closed bool
	notify chan struct{} // one token: something changed
}

// ch returns the completion channel; the caller holds mu.
func (c *Completions) ch() chan struct{} {
	if c.notify == nil {
		c.notify = make(chan struct{}, 1)
	}
	return c.notify
}

// Push appends wc and wakes a waiter.
func (c *Completions) Push(wc rdma.Completion) {
	c.mu.Lock()
	c.q = append(c.q, wc)
	c.mu.Unlock()
	c.Signal()
}

// Signal wakes a waiter without a completion (a close, a deadline).
func (c *Completions) Signal() {
	c.mu.Lock()
	ch := c.ch()
	c.mu.Unlock()
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Notify returns the completion channel: it holds a token after a Push,
// Signal or Close.
func (c *Completions) Notify() <-chan struct{} {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.ch()
}

// Len returns how many completions are ready.
func (c *Completions) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.q)
}

// Poll moves up to len(wc) completions into wc and returns how many; it
// does not block.
func (c *Completions) Poll(wc []rdma.Completion) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := copy(wc, c.q)
	c.q = c.q[n:]
	if len(c.q) == 0 {
		c.q = nil
	}
	return n
}

// Wait blocks until at least one completion is ready, the queue is
// closed (fabric.ErrClosed) or ctx is done.
func (c *Completions) Wait(ctx context.Context) error {
	for {
		c.mu.Lock()
		ready, closed, ch := len(c.q) > 0, c.closed, c.ch()
		c.mu.Unlock()
		switch {
		case ready:
			return nil
		case closed:
			return fabric.ErrClosed
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// Close wakes Wait for good: from now on it returns fabric.ErrClosed once
// no completion is ready. Idempotent.
func (c *Completions) Close() error {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	c.Signal()
	return nil
}
