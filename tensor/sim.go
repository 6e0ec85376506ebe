package tensor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// SimMemory is a simulated accelerator's memory. Its capacity is a device
// address space that a first-fit allocator hands out (so fragmentation and
// out-of-memory behave as on a device), and each allocation is backed by
// its own memfd (a segment), as CUDA's VMM backs each cuMemCreate
// allocation with its own physical memory: sharing one allocation with
// another process (Export) shares that allocation and nothing else. An 80 GB
// device costs only the memory of its live allocations. Copies in and out of
// it are real memory copies.
//
// Allocations are populated at once, as device memory is resident once
// allocated. Released allocations that were never exported are kept (up to
// a quarter of the capacity, at most DefaultHostCache bytes) and reused by
// later allocations of the same page-rounded size, so a loop of Gets into
// one device touches new pages once; exported ones are never reused (see
// Exportable). Reused memory is not zeroed, as on a device.
type SimMemory struct {
	dev DeviceID

	mu     sync.Mutex
	alloc  *rangeAllocator
	live   map[*segment]struct{} // segments of live allocations: Close unmaps them
	cache  segmentCache
	closed bool
}

var (
	_ Memory     = (*SimMemory)(nil)
	_ Buffer     = (*simBuffer)(nil)
	_ Exportable = (*simBuffer)(nil)
)

// NewSimMemory creates a simulated device with the given capacity in bytes.
func NewSimMemory(dev DeviceID, capacity int64) (*SimMemory, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("tensor: simulated device %v needs a positive capacity, got %d", dev, capacity)
	}
	capacity = alignUp(capacity)
	return &SimMemory{
		dev: dev, alloc: newRangeAllocator(capacity), live: map[*segment]struct{}{},
		cache: segmentCache{limit: min(capacity/4, DefaultHostCache)},
	}, nil
}

// Device returns the simulated device's ID.
func (m *SimMemory) Device() DeviceID { return m.dev }

// Alloc reserves n bytes of the device. Zero-byte allocations succeed and
// take no space.
func (m *SimMemory) Alloc(ctx context.Context, n int64) (Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("tensor: negative allocation %d on %v", n, m.dev)
	}
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, fmt.Errorf("tensor: %v: %w", m.dev, ErrClosed)
	}
	if n == 0 {
		m.alloc.allocs++
		m.mu.Unlock()
		return &simBuffer{mem: m}, nil
	}
	size := alignUp(n)
	off, ok := m.alloc.alloc(size)
	if !ok {
		err := &OutOfMemoryError{Device: m.dev, Requested: n, Free: m.alloc.capacity - m.alloc.used, LargestFree: m.alloc.largestFree()}
		m.mu.Unlock()
		return nil, err
	}
	seg := m.cache.take(pageRound(n))
	m.mu.Unlock()
	if seg == nil {
		// Outside the lock: creating and populating a large segment takes a
		// while, and other allocations need not wait for it.
		var err error
		seg, err = newSegment("tensorlane-sim-"+m.dev.String(), pageRound(n), true)
		if err != nil {
			m.mu.Lock()
			m.alloc.release(off, size)
			m.mu.Unlock()
			if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
				return nil, &OutOfMemoryError{Device: m.dev, Requested: n}
			}
			return nil, fmt.Errorf("tensor: allocate %d bytes on %v: %w", n, m.dev, err)
		}
	}
	m.mu.Lock()
	if m.closed {
		m.alloc.release(off, size)
		m.mu.Unlock()
		seg.free()
		return nil, fmt.Errorf("tensor: %v: %w", m.dev, ErrClosed)
	}
	m.live[seg] = struct{}{}
	m.mu.Unlock()
	return &simBuffer{mem: m, seg: seg, off: off, n: n, size: size}, nil
}

// Stats reports capacity and use.
func (m *SimMemory) Stats() MemStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return MemStats{
		Device: m.dev, Simulated: true, Backend: "sim", Capacity: m.alloc.capacity, Used: m.alloc.used,
		Free: m.alloc.capacity - m.alloc.used, LargestFree: m.alloc.largestFree(),
		Allocs: m.alloc.allocs, Peak: m.alloc.peak, Cached: m.cache.bytes,
	}
}

// SetCacheLimit changes how many bytes of released, never-exported
// allocations are kept for reuse; 0 turns the cache off.
func (m *SimMemory) SetCacheLimit(n int64) {
	m.mu.Lock()
	m.cache.limit = max(n, 0)
	drop := m.cache.trim()
	m.mu.Unlock()
	freeAll(drop)
}

// Close unmaps the device's memory. Buffers still live become unusable
// (Bytes returns nil); handles exported before keep their allocation's
// memory alive until their holders let go. Close is idempotent.
func (m *SimMemory) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	m.cache.limit = 0
	drop := m.cache.trim()
	for s := range m.live {
		drop = append(drop, s)
	}
	m.live = nil
	m.mu.Unlock()
	return freeAll(drop)
}

type simBuffer struct {
	mem      *SimMemory
	seg      *segment // nil for an empty buffer
	off, n   int64    // off: the allocation's place in the device address space
	size     int64    // aligned size reserved in the address space
	released atomic.Bool
}

func (b *simBuffer) Device() DeviceID { return b.mem.dev }
func (b *simBuffer) Len() int64       { return b.n }

// Bytes returns the buffer's bytes.
func (b *simBuffer) Bytes() []byte {
	if b.released.Load() {
		return nil
	}
	b.mem.mu.Lock()
	defer b.mem.mu.Unlock()
	if b.mem.closed {
		return nil
	}
	if b.seg == nil {
		return []byte{}
	}
	return b.seg.data[:b.n:b.n]
}

// Release returns the allocation to the device; later calls do nothing.
// An exported allocation's memory is never reused (see Exportable).
func (b *simBuffer) Release() error {
	if b.released.Swap(true) {
		return nil
	}
	m := b.mem
	m.mu.Lock()
	if b.seg == nil {
		m.alloc.allocs--
		m.mu.Unlock()
		return nil
	}
	m.alloc.release(b.off, b.size)
	if m.closed {
		m.mu.Unlock()
		return nil // Close freed the segment
	}
	delete(m.live, b.seg)
	kept := m.cache.put(b.seg)
	m.mu.Unlock()
	if kept {
		return nil
	}
	return b.seg.free()
}

// Export shares this allocation, and only it, with another process (see
// Exportable).
func (b *simBuffer) Export(a Access) (Handle, error) {
	if b.released.Load() {
		return Handle{}, ErrReleased
	}
	if b.seg == nil {
		return Handle{}, fmt.Errorf("%w: an empty allocation has nothing to share", ErrNotExportable)
	}
	h, err := b.seg.export(a, b.n)
	if err != nil {
		return Handle{}, fmt.Errorf("tensor: export %v allocation: %w", b.mem.dev, err)
	}
	return h, nil
}
