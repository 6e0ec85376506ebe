package capi

import (
	"context"
	"sync"
	"sync/atomic"

	"github.com/tensorlane/tensorlane/tensor"
)

// The staging pool. A foreign Put read by another process on the host is
// copied once into shareable memory (tensor.Foreign), and on a VM most of
// that copy's time is the kernel populating fresh shared-memory pages, not
// the copy. The pool keeps a few allocations ready with their pages already
// populated, of the sizes staged lately (a training loop publishes the same
// shapes every step), and refills them in the background after each use,
// off the reader's critical path. Pooled memory has never been shared: an
// allocation leaves the pool for good when a staging copy takes it (and,
// once exported, is never reused, per tensor/share.go). The pool holds at
// most limit bytes; sizes under minPooled are not pooled, as populating a
// few pages costs little.

// DefaultStagePool bounds the pool when Config.StagePoolBytes is 0.
const DefaultStagePool = 256 << 20

const minPooled = 1 << 20

// stagePool is the tensor.Memory a runtime's foreign Puts stage into.
type stagePool struct {
	host  tensor.Memory
	limit int64

	mu       sync.Mutex
	ready    map[int64][]tensor.Buffer // populated, never shared, by size
	order    []int64                   // sizes in the order they were last taken (oldest first)
	reserved int64                     // bytes ready or being filled
	held     atomic.Int64              // bytes ready (allocated)
	closed   bool
	fills    sync.WaitGroup

	hits, misses atomic.Int64
}

func newStagePool(host tensor.Memory, limit int64) *stagePool {
	return &stagePool{host: host, limit: limit, ready: map[int64][]tensor.Buffer{}}
}

func (p *stagePool) Device() tensor.DeviceID { return p.host.Device() }
func (p *stagePool) Stats() tensor.MemStats  { return p.host.Stats() }

// Alloc hands out a ready allocation of exactly n bytes if there is one,
// else a fresh one, and starts refilling the pool with one of n bytes.
func (p *stagePool) Alloc(ctx context.Context, n int64) (tensor.Buffer, error) {
	if n < minPooled || n > p.limit {
		return p.host.Alloc(ctx, n)
	}
	p.mu.Lock()
	var buf tensor.Buffer
	if l := p.ready[n]; len(l) > 0 {
		buf = l[len(l)-1]
		p.ready[n] = l[:len(l)-1]
		p.reserved -= n
		p.held.Add(-n)
	}
	p.touch(n)
	refill := !p.closed && p.makeRoom(n)
	if refill {
		p.reserved += n
		p.fills.Add(1)
	}
	p.mu.Unlock()
	if refill {
		go p.fill(n)
	}
	if buf != nil {
		p.hits.Add(1)
		return buf, nil
	}
	p.misses.Add(1)
	return p.host.Alloc(ctx, n)
}

// touch moves n to the end of the recently used sizes.
func (p *stagePool) touch(n int64) {
	for i, s := range p.order {
		if s == n {
			p.order = append(p.order[:i], p.order[i+1:]...)
			break
		}
	}
	p.order = append(p.order, n)
}

// makeRoom frees ready allocations of the sizes used least lately until n
// more bytes fit, and reports whether they do.
func (p *stagePool) makeRoom(n int64) bool {
	for _, s := range p.order {
		if p.reserved+n <= p.limit {
			break
		}
		if s == n {
			continue
		}
		for len(p.ready[s]) > 0 && p.reserved+n > p.limit {
			l := p.ready[s]
			l[len(l)-1].Release()
			p.ready[s] = l[:len(l)-1]
			p.reserved -= s
			p.held.Add(-s)
		}
	}
	return p.reserved+n <= p.limit
}

func (p *stagePool) fill(n int64) {
	defer p.fills.Done()
	buf, err := p.host.Alloc(context.Background(), n)
	if err == nil {
		p.held.Add(n) // counted apart from the runtime's Used from now on
		var b []byte
		if b, err = tensor.BytesOf(buf); err == nil {
			tensor.Populate(b)
		} else {
			buf.Release()
			p.held.Add(-n)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if err != nil || p.closed {
		p.reserved -= n
		if err == nil {
			buf.Release()
			p.held.Add(-n)
		}
		return
	}
	p.ready[n] = append(p.ready[n], buf)
}

// close waits for fills in flight and gives the ready allocations back.
func (p *stagePool) close() {
	p.mu.Lock()
	p.closed = true
	p.mu.Unlock()
	p.fills.Wait()
	p.mu.Lock()
	defer p.mu.Unlock()
	for n, l := range p.ready {
		for _, b := range l {
			b.Release()
			p.held.Add(-n)
		}
		delete(p.ready, n)
	}
	p.reserved = 0
}
