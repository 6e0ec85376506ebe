package tensor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"golang.org/x/sys/unix"
)

// SimMemory is a simulated accelerator's memory: one arena per device,
// backed by a Linux memfd of the device's full capacity. The file is sparse,
// so an 80 GB device costs only the pages that are written. Copies in and out
// of it are real memory copies. Because the arena is a file, it can be shared
// with other processes (Export), as CUDA IPC shares device memory.
type SimMemory struct {
	dev  DeviceID
	fd   int
	data []byte

	mu        sync.Mutex
	alloc     *rangeAllocator
	populated int64 // pages below this offset are resident
	closed    bool
}

var (
	_ Memory = (*SimMemory)(nil)
	_ Buffer = (*simBuffer)(nil)
)

// NewSimMemory creates a simulated device with the given capacity in bytes.
func NewSimMemory(dev DeviceID, capacity int64) (*SimMemory, error) {
	if capacity <= 0 {
		return nil, fmt.Errorf("tensor: simulated device %v needs a positive capacity, got %d", dev, capacity)
	}
	capacity = alignUp(capacity)
	fd, err := unix.MemfdCreate("tensorlane-sim-"+dev.String(), unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("tensor: memfd for %v: %w", dev, err)
	}
	if err := unix.Ftruncate(fd, capacity); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tensor: size arena of %v to %d bytes: %w", dev, capacity, err)
	}
	data, err := unix.Mmap(fd, 0, int(capacity), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED|unix.MAP_NORESERVE)
	if err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("tensor: map arena of %v: %w", dev, err)
	}
	return &SimMemory{dev: dev, fd: fd, data: data, alloc: newRangeAllocator(capacity)}, nil
}

// Device returns the simulated device's ID.
func (m *SimMemory) Device() DeviceID { return m.dev }

// Alloc reserves n bytes in the arena. Zero-byte allocations succeed and
// take no space.
func (m *SimMemory) Alloc(ctx context.Context, n int64) (Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("tensor: negative allocation %d on %v", n, m.dev)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil, fmt.Errorf("tensor: %v: %w", m.dev, ErrClosed)
	}
	if n == 0 {
		m.alloc.allocs++
		return &simBuffer{mem: m}, nil
	}
	size := alignUp(n)
	off, ok := m.alloc.alloc(size)
	if !ok {
		return nil, &OutOfMemoryError{Device: m.dev, Requested: n, Free: m.alloc.capacity - m.alloc.used, LargestFree: m.alloc.largestFree()}
	}
	m.populate(off, size)
	return &simBuffer{mem: m, off: off, n: n, size: size}, nil
}

// populate makes the block's pages resident now, as device memory is once
// allocated, so that transfers measure copies rather than page faults on a
// sparse file. Pages stay resident after Release, and first-fit only hands
// out space below the high-water mark that was allocated (so populated)
// before, so only the part above the mark needs it. Kernels without
// MADV_POPULATE_WRITE (before 5.14) fault on first touch instead. Called
// with m.mu held.
func (m *SimMemory) populate(off, size int64) {
	const page = 4096
	end := min((off+size+page-1)&^(page-1), int64(len(m.data)))
	start := max(off&^(page-1), m.populated)
	if start >= end {
		return
	}
	_ = unix.Madvise(m.data[start:end], unix.MADV_POPULATE_WRITE)
	m.populated = end
}

// Stats reports capacity and use.
func (m *SimMemory) Stats() MemStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	return MemStats{
		Device: m.dev, Simulated: true, Capacity: m.alloc.capacity, Used: m.alloc.used,
		Free: m.alloc.capacity - m.alloc.used, LargestFree: m.alloc.largestFree(),
		Allocs: m.alloc.allocs, Peak: m.alloc.peak,
	}
}

// FD returns the arena's file descriptor, for sharing with other processes.
// It stays owned by the SimMemory.
func (m *SimMemory) FD() int { return m.fd }

// Close unmaps the arena. Buffers still live become unusable (Bytes returns
// nil). Close is idempotent.
func (m *SimMemory) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return nil
	}
	m.closed = true
	err := unix.Munmap(m.data)
	if cerr := unix.Close(m.fd); err == nil {
		err = cerr
	}
	m.data = nil
	return err
}

type simBuffer struct {
	mem      *SimMemory
	off, n   int64
	size     int64 // aligned size actually reserved
	released atomic.Bool
}

func (b *simBuffer) Device() DeviceID { return b.mem.dev }
func (b *simBuffer) Len() int64       { return b.n }

// Bytes returns the buffer's bytes in the arena mapping.
func (b *simBuffer) Bytes() []byte {
	if b.released.Load() {
		return nil
	}
	b.mem.mu.Lock()
	defer b.mem.mu.Unlock()
	if b.mem.closed {
		return nil
	}
	return b.mem.data[b.off : b.off+b.n : b.off+b.n]
}

// Release returns the block to the arena; later calls do nothing.
func (b *simBuffer) Release() error {
	if b.released.Swap(true) {
		return nil
	}
	b.mem.mu.Lock()
	defer b.mem.mu.Unlock()
	if b.size == 0 {
		b.mem.alloc.allocs--
		return nil
	}
	b.mem.alloc.release(b.off, b.size)
	return nil
}

// Export returns a duplicate of the arena's descriptor and the buffer's
// place in it.
func (b *simBuffer) Export() (Handle, error) {
	if b.released.Load() {
		return Handle{}, ErrReleased
	}
	fd, err := unix.FcntlInt(uintptr(b.mem.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return Handle{}, fmt.Errorf("tensor: export %v buffer: %w", b.mem.dev, err)
	}
	return Handle{FD: fd, ArenaSize: b.mem.alloc.capacity, Offset: b.off, Length: b.n}, nil
}
