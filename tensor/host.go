package tensor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// ErrClosed is returned by memory that was closed; it wraps net.ErrClosed.
var ErrClosed = fmt.Errorf("tensor: memory closed: %w", net.ErrClosed)

// HostMemory is the host's own memory. Each allocation is its own mapping
// of its own memfd (a segment), so a buffer can be shared with another
// process (Export) without sharing anything else, which the shm path maps,
// and Release gives the pages back at once instead of waiting for the
// garbage collector.
//
// Populating fresh pages costs more than copying into them, so, like the
// caching host allocators of the frameworks (pinned host memory is dear to
// get), released buffers that were never exported are kept, up to
// CacheLimit bytes, and handed to later allocations of the same page-rounded
// size: a loop of Gets into host memory touches new pages once. An
// exported buffer is never reused, since another process may still map its
// memfd. Reused memory is not zeroed (no Memory promises zeroed memory).
// A zero capacity means unbounded.
type HostMemory struct {
	dev      DeviceID
	capacity int64

	mu     sync.Mutex
	used   int64
	peak   int64
	allocs int
	closed bool
	cache  segmentCache // released, never-exported segments
	ready  *segment     // Prefault's memory, until a large allocation takes it
}

// DefaultHostCache is the most released host memory kept for reuse.
const DefaultHostCache = 1 << 30

var _ Memory = (*HostMemory)(nil)

// NewHostMemory returns host memory accounting up to capacity bytes (0 =
// unbounded), keeping up to DefaultHostCache bytes of released buffers for
// reuse (at most a quarter of a bounded capacity).
func NewHostMemory(capacity int64) *HostMemory {
	limit := int64(DefaultHostCache)
	if capacity > 0 {
		limit = min(limit, capacity/4)
	}
	return &HostMemory{dev: HostDevice, capacity: capacity, cache: segmentCache{limit: limit}}
}

// SetCacheLimit changes how many bytes of released buffers are kept for
// reuse; 0 turns the cache off. Buffers over the new limit are unmapped.
func (m *HostMemory) SetCacheLimit(n int64) {
	m.mu.Lock()
	m.cache.limit = max(n, 0)
	drop := m.cache.trim()
	m.mu.Unlock()
	freeAll(drop)
}

// Close unmaps the cached buffers; later allocations fail with ErrClosed.
// Live buffers stay usable until released. Idempotent.
func (m *HostMemory) Close() error {
	m.mu.Lock()
	m.closed = true
	m.cache.limit = 0
	drop := m.cache.trim()
	if m.ready != nil {
		drop = append(drop, m.ready)
		m.ready = nil
	}
	m.mu.Unlock()
	return freeAll(drop)
}

// Prefault makes n bytes (page-rounded) of fresh memory resident now, and
// holds them for the next allocation of at least PrefaultMin bytes that
// finds no released buffer of its size: it gets them, shrunk to its size
// (the pages past it go back to the system), so its first write faults
// nothing. That allocation is usually a reader's first Get into host
// memory (its destination): populating fresh pages costs more than the
// copy into them, and on a VM several times more. It serves one
// allocation: later ones reuse released buffers (see above), or pay for
// fresh pages. A second Prefault replaces the first's memory. The bytes
// held count in Stats as Cached, not Used.
func (m *HostMemory) Prefault(n int64) error {
	if n <= 0 {
		return nil
	}
	seg, err := newSegmentSealed("tensorlane-host", pageRound(n), true, false)
	if err != nil {
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
			return &OutOfMemoryError{Device: m.dev, Requested: n}
		}
		return fmt.Errorf("tensor: prefault %d bytes: %w", n, err)
	}
	m.mu.Lock()
	old := m.ready
	if m.closed {
		old, seg = seg, nil
	}
	m.ready = seg
	m.mu.Unlock()
	if old != nil {
		old.free()
	}
	if seg == nil {
		return ErrClosed
	}
	return nil
}

// PrefaultMin is the smallest allocation Prefault's memory serves: under
// it, fresh pages cost little, and shrinking the held memory would waste it.
const PrefaultMin = 1 << 20

// takeReady returns Prefault's memory for an allocation of size bytes, or
// nil; m.mu is held.
func (m *HostMemory) takeReady(size int64) *segment {
	s := m.ready
	if s == nil || size < PrefaultMin || int64(len(s.data)) < size {
		return nil
	}
	m.ready = nil
	return s
}

// Device returns HostDevice.
func (m *HostMemory) Device() DeviceID { return m.dev }

// Alloc maps n bytes of a new memfd (or of a cached one of the same size).
func (m *HostMemory) Alloc(ctx context.Context, n int64) (Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("tensor: negative allocation %d on %v", n, m.dev)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	if m.capacity > 0 && m.used+n > m.capacity {
		free := m.capacity - m.used
		m.mu.Unlock()
		return nil, &OutOfMemoryError{Device: m.dev, Requested: n, Free: free, LargestFree: free}
	}
	m.used += n
	m.allocs++
	if m.used > m.peak {
		m.peak = m.used
	}
	b := &hostBuffer{mem: m, n: n}
	size := pageRound(n)
	var ready *segment
	if n > 0 {
		if b.seg = m.cache.take(size); b.seg == nil {
			ready = m.takeReady(size)
		}
	}
	m.mu.Unlock()
	if ready != nil {
		if err := ready.fit(size); err != nil {
			ready.free()
		} else {
			b.seg = ready
		}
	}
	if n > 0 && b.seg == nil {
		seg, err := newSegment("tensorlane-host", size, false)
		if err != nil {
			m.account(-n)
			if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
				return nil, &OutOfMemoryError{Device: m.dev, Requested: n}
			}
			return nil, fmt.Errorf("tensor: host alloc %d: %w", n, err)
		}
		b.seg = seg
	}
	return b, nil
}

var pageSize = int64(unix.Getpagesize())

func pageRound(n int64) int64 { return (n + pageSize - 1) &^ (pageSize - 1) }

func (m *HostMemory) account(n int64) {
	m.mu.Lock()
	m.used += n
	m.allocs--
	m.mu.Unlock()
}

// Stats reports use.
func (m *HostMemory) Stats() MemStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := MemStats{Device: m.dev, Backend: "host", Capacity: m.capacity, Used: m.used, Allocs: m.allocs, Peak: m.peak, Cached: m.cache.bytes}
	if m.ready != nil {
		s.Cached += int64(len(m.ready.data))
	}
	if m.capacity > 0 {
		s.Free = m.capacity - m.used
		s.LargestFree = s.Free
	}
	return s
}

type hostBuffer struct {
	mem      *HostMemory
	n        int64
	seg      *segment // nil for an empty buffer
	released atomic.Bool
}

var _ Exportable = (*hostBuffer)(nil)

// Export shares the buffer's own memfd (see Exportable).
func (b *hostBuffer) Export(a Access) (Handle, error) {
	if b.released.Load() {
		return Handle{}, ErrReleased
	}
	if b.seg == nil {
		return Handle{}, fmt.Errorf("%w: an empty host buffer has nothing to share", ErrNotExportable)
	}
	h, err := b.seg.export(a, b.n)
	if err != nil {
		return Handle{}, fmt.Errorf("tensor: export host buffer: %w", err)
	}
	return h, nil
}

func (b *hostBuffer) Device() DeviceID { return b.mem.dev }
func (b *hostBuffer) Len() int64       { return b.n }

func (b *hostBuffer) Bytes() []byte {
	if b.released.Load() {
		return nil
	}
	if b.seg == nil {
		return []byte{}
	}
	return b.seg.data[:b.n:b.n]
}

func (b *hostBuffer) Release() error {
	if b.released.Swap(true) {
		return nil
	}
	m := b.mem
	m.mu.Lock()
	m.used -= b.n
	m.allocs--
	kept := b.seg != nil && !m.closed && m.cache.put(b.seg)
	m.mu.Unlock()
	if b.seg == nil || kept {
		return nil
	}
	return b.seg.free()
}
