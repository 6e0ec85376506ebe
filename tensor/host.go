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
// of its own memfd, so a buffer can be shared with another process
// (Export), which the shm path maps, and Release gives the pages back at
// once instead of waiting for the garbage collector.
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
	// cache holds released, never-exported mappings by size; cached is
	// their total, at most limit.
	cache  map[int64][]hostMapping
	cached int64
	limit  int64
}

// hostMapping is one memfd and its mapping.
type hostMapping struct {
	fd   int
	data []byte // the whole mapping (page-rounded)
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
	return &HostMemory{dev: HostDevice, capacity: capacity, limit: limit}
}

// SetCacheLimit changes how many bytes of released buffers are kept for
// reuse; 0 turns the cache off. Buffers over the new limit are unmapped.
func (m *HostMemory) SetCacheLimit(n int64) {
	m.mu.Lock()
	m.limit = max(n, 0)
	drop := m.trimLocked()
	m.mu.Unlock()
	unmapAll(drop)
}

// trimLocked takes mappings out of the cache until it fits its limit and
// returns them for unmapping outside the lock.
func (m *HostMemory) trimLocked() []hostMapping {
	var drop []hostMapping
	for size, list := range m.cache {
		for len(list) > 0 && m.cached > m.limit {
			drop = append(drop, list[len(list)-1])
			list = list[:len(list)-1]
			m.cached -= size
		}
		if len(list) == 0 {
			delete(m.cache, size)
		} else {
			m.cache[size] = list
		}
	}
	return drop
}

func unmapAll(ms []hostMapping) error {
	var errs []error
	for _, hm := range ms {
		errs = append(errs, unix.Munmap(hm.data), unix.Close(hm.fd))
	}
	return errors.Join(errs...)
}

// Close unmaps the cached buffers; later allocations fail with ErrClosed.
// Live buffers stay usable until released. Idempotent.
func (m *HostMemory) Close() error {
	m.mu.Lock()
	m.closed = true
	m.limit = 0
	drop := m.trimLocked()
	m.mu.Unlock()
	return unmapAll(drop)
}

// Device returns HostDevice.
func (m *HostMemory) Device() DeviceID { return m.dev }

// Alloc maps n bytes of a new memfd.
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
	b := &hostBuffer{mem: m, n: n, fd: -1}
	size := pageRound(n)
	if list := m.cache[size]; n > 0 && len(list) > 0 {
		hm := list[len(list)-1]
		m.cache[size] = list[:len(list)-1]
		m.cached -= size
		m.mu.Unlock()
		b.fd, b.data = hm.fd, hm.data[:n]
		return b, nil
	}
	m.mu.Unlock()
	if n > 0 {
		if err := b.mapNew(size); err != nil {
			m.account(-n)
			if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
				return nil, &OutOfMemoryError{Device: m.dev, Requested: n}
			}
			return nil, fmt.Errorf("tensor: host alloc %d: %w", n, err)
		}
	}
	return b, nil
}

// mapNew maps size bytes (n page-rounded) of a new memfd.
func (b *hostBuffer) mapNew(size int64) error {
	fd, err := unix.MemfdCreate("tensorlane-host", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		unix.Close(fd)
		return err
	}
	data, err := unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return err
	}
	b.fd, b.data = fd, data[:b.n]
	return nil
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
	s := MemStats{Device: m.dev, Capacity: m.capacity, Used: m.used, Allocs: m.allocs, Peak: m.peak, Cached: m.cached}
	if m.capacity > 0 {
		s.Free = m.capacity - m.used
		s.LargestFree = s.Free
	}
	return s
}

type hostBuffer struct {
	mem      *HostMemory
	n        int64
	fd       int    // the memfd behind data; -1 for an empty buffer
	data     []byte // the first n bytes of a page-rounded mapping
	exported atomic.Bool
	released atomic.Bool
}

var _ Exportable = (*hostBuffer)(nil)

// Export returns a duplicate of the buffer's memfd; the buffer fills it.
func (b *hostBuffer) Export() (Handle, error) {
	if b.released.Load() {
		return Handle{}, ErrReleased
	}
	if b.fd < 0 {
		return Handle{}, fmt.Errorf("tensor: an empty host buffer has nothing to share")
	}
	b.exported.Store(true) // another process may map it: never reuse it
	fd, err := unix.FcntlInt(uintptr(b.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return Handle{}, fmt.Errorf("tensor: export host buffer: %w", err)
	}
	return Handle{FD: fd, ArenaSize: pageRound(b.n), Offset: 0, Length: b.n}, nil
}

func (b *hostBuffer) Device() DeviceID { return b.mem.dev }
func (b *hostBuffer) Len() int64       { return b.n }

func (b *hostBuffer) Bytes() []byte {
	if b.released.Load() {
		return nil
	}
	if b.data == nil {
		return []byte{}
	}
	return b.data
}

func (b *hostBuffer) Release() error {
	if b.released.Swap(true) {
		return nil
	}
	m := b.mem
	size := pageRound(b.n)
	hm := hostMapping{fd: b.fd, data: b.data[:size:size]}
	m.mu.Lock()
	m.used -= b.n
	m.allocs--
	if b.fd >= 0 && !b.exported.Load() && !m.closed && m.cached+size <= m.limit {
		if m.cache == nil {
			m.cache = map[int64][]hostMapping{}
		}
		m.cache[size] = append(m.cache[size], hm)
		m.cached += size
		m.mu.Unlock()
		return nil
	}
	m.mu.Unlock()
	if b.fd < 0 {
		return nil
	}
	return unmapAll([]hostMapping{hm})
}
