package provbase

import (
	"context"
	"fmt"
	"sync"

	"github.com/tensorlane/tensorlane/fabric"
)

// Calls is a queue pair's two-sided calls (QueuePair.Call) waiting for
// their answers, by wire id: the provider's receiver hands each answer
// to Take's channel, Round does the rest. Its zero value is empty.
type Calls[T any] struct {
	mu  sync.Mutex // a leaf
	seq uint64
	m   map[uint64]chan T
}

// Round runs one call of n message bytes (at most max, else
// fabric.ErrBadRequest): it registers an answer channel under a fresh
// id, has send post the message (send checks the queue pair's state
// under its own lock and returns why it cannot), then waits for the
// answer, ctx, or the queue pair's break (f's reason). The id is gone
// when Round returns: a late answer is dropped.
func (c *Calls[T]) Round(ctx context.Context, f *Fault, n, max int, send func(id uint64) error) (T, error) {
	var zero T
	if n > max {
		return zero, fmt.Errorf("%w: message of %d bytes (max %d)", fabric.ErrBadRequest, n, max)
	}
	c.mu.Lock()
	if c.m == nil {
		c.m = map[uint64]chan T{}
	}
	c.seq++
	id, ch := c.seq, make(chan T, 1)
	c.m[id] = ch
	c.mu.Unlock()
	defer c.Take(id)
	if err := send(id); err != nil {
		return zero, err
	}
	select {
	case a := <-ch:
		return a, nil
	case <-ctx.Done():
		return zero, ctx.Err()
	case <-f.Broken():
		return zero, f.Err()
	}
}

// Take removes the call id and returns its answer channel (buffered: a
// send never blocks), nil when the caller gave up or it was flushed.
func (c *Calls[T]) Take(id uint64) chan T {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch := c.m[id]
	delete(c.m, id)
	return ch
}

// Len returns how many calls wait for their answers.
func (c *Calls[T]) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.m)
}

// Flush removes every call and returns their answer channels.
func (c *Calls[T]) Flush() []chan T {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]chan T, 0, len(c.m))
	for id, ch := range c.m {
		out = append(out, ch)
		delete(c.m, id)
	}
	return out
}
