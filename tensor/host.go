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
// of its own memfd, so Release gives the pages back to the kernel at once
// instead of waiting for the garbage collector, and a buffer can be shared
// with another process (Export), which the shm path maps. A zero capacity
// means unbounded.
type HostMemory struct {
	dev      DeviceID
	capacity int64

	mu     sync.Mutex
	used   int64
	peak   int64
	allocs int
}

var _ Memory = (*HostMemory)(nil)

// NewHostMemory returns host memory accounting up to capacity bytes (0 =
// unbounded).
func NewHostMemory(capacity int64) *HostMemory {
	return &HostMemory{dev: HostDevice, capacity: capacity}
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
	m.mu.Unlock()
	b := &hostBuffer{mem: m, n: n, fd: -1}
	if n > 0 {
		if err := b.mapNew(); err != nil {
			m.account(-n)
			if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
				return nil, &OutOfMemoryError{Device: m.dev, Requested: n}
			}
			return nil, fmt.Errorf("tensor: host alloc %d: %w", n, err)
		}
	}
	return b, nil
}

func (b *hostBuffer) mapNew() error {
	fd, err := unix.MemfdCreate("tensorlane-host", unix.MFD_CLOEXEC)
	if err != nil {
		return err
	}
	if err := unix.Ftruncate(fd, b.n); err != nil {
		unix.Close(fd)
		return err
	}
	data, err := unix.Mmap(fd, 0, int(b.n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		unix.Close(fd)
		return err
	}
	b.fd, b.data = fd, data
	return nil
}

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
	s := MemStats{Device: m.dev, Capacity: m.capacity, Used: m.used, Allocs: m.allocs, Peak: m.peak}
	if m.capacity > 0 {
		s.Free = m.capacity - m.used
		s.LargestFree = s.Free
	}
	return s
}

type hostBuffer struct {
	mem      *HostMemory
	n        int64
	fd       int // the memfd behind data; -1 for an empty buffer
	data     []byte
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
	fd, err := unix.FcntlInt(uintptr(b.fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return Handle{}, fmt.Errorf("tensor: export host buffer: %w", err)
	}
	return Handle{FD: fd, ArenaSize: b.n, Offset: 0, Length: b.n}, nil
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
	var err error
	if b.data != nil {
		err = unix.Munmap(b.data)
	}
	if b.fd >= 0 {
		if cerr := unix.Close(b.fd); err == nil {
			err = cerr
		}
	}
	b.mem.account(-b.n)
	return err
}
