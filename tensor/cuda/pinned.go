package cuda

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"unsafe"

	"github.com/tensorlane/tensorlane/tensor"
)

// Pinned host memory (cuMemHostAlloc) for transports that need host bytes
// (tcp, rdma): a socket reads straight into it and the device takes it in
// one DMA, with no bounce through the lanes' staging chunks. Getting
// pinned memory is slow (the driver pins every page), so released buffers
// are kept, up to pinnedCacheLimit bytes, for the next transfer of the
// same size.

const pinnedCacheLimit = 512 << 20

type pinnedPool struct {
	mu     sync.Mutex
	live   map[uintptr]int64 // base -> length of every pinned buffer handed out
	cache  map[int64][]unsafe.Pointer
	cached int64
}

// PinnedBuffer is page-locked host memory of one device's driver: host
// visible, and copied to and from device memory by DMA directly.
type PinnedBuffer struct {
	mem      *Memory
	p        unsafe.Pointer
	n        int64
	released atomic.Bool
}

var (
	_ tensor.Buffer      = (*PinnedBuffer)(nil)
	_ tensor.HostVisible = (*PinnedBuffer)(nil)
	_ tensor.Stager      = (*Buffer)(nil)
)

// Device returns the host device (the memory is the host's, pinned).
func (b *PinnedBuffer) Device() tensor.DeviceID { return tensor.HostDevice }

// Len returns the buffer's length.
func (b *PinnedBuffer) Len() int64 { return b.n }

// Bytes returns the pinned bytes, or nil after Release.
func (b *PinnedBuffer) Bytes() []byte {
	if b.released.Load() {
		return nil
	}
	return unsafe.Slice((*byte)(b.p), b.n)
}

// Release returns the memory to the pool's cache, or frees it.
func (b *PinnedBuffer) Release() error {
	if b.released.Swap(true) {
		return nil
	}
	return b.mem.putPinned(b.p, b.n)
}

// Staging returns n bytes of pinned host memory of the buffer's driver
// (tensor.Stager).
func (b *Buffer) Staging(ctx context.Context, n int64) (tensor.Buffer, error) {
	return b.mem.Pinned(ctx, n)
}

// Pinned returns n bytes of pinned host memory.
func (m *Memory) Pinned(ctx context.Context, n int64) (*PinnedBuffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n <= 0 {
		return nil, fmt.Errorf("cuda: pinned buffer of %d bytes", n)
	}
	pp := &m.pinned
	pp.mu.Lock()
	if list := pp.cache[n]; len(list) > 0 {
		p := list[len(list)-1]
		pp.cache[n] = list[:len(list)-1]
		pp.cached -= n
		pp.live[uintptr(p)] = n
		pp.mu.Unlock()
		return &PinnedBuffer{mem: m, p: p, n: n}, nil
	}
	pp.mu.Unlock()
	var p unsafe.Pointer
	err := m.drv.on(m.ctx, func() error {
		return m.drv.err("cuMemHostAlloc", m.drv.api.cuMemHostAlloc(&p, uint64(n), memHostAllocPortable))
	})
	if err != nil {
		return nil, fmt.Errorf("cuda: pin %d bytes of host memory: %w", n, err)
	}
	pp.mu.Lock()
	if pp.live == nil {
		pp.live = map[uintptr]int64{}
	}
	pp.live[uintptr(p)] = n
	pp.mu.Unlock()
	return &PinnedBuffer{mem: m, p: p, n: n}, nil
}

func (m *Memory) putPinned(p unsafe.Pointer, n int64) error {
	pp := &m.pinned
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	pp.mu.Lock()
	delete(pp.live, uintptr(p))
	if !closed && pp.cached+n <= pinnedCacheLimit {
		if pp.cache == nil {
			pp.cache = map[int64][]unsafe.Pointer{}
		}
		pp.cache[n] = append(pp.cache[n], p)
		pp.cached += n
		pp.mu.Unlock()
		return nil
	}
	pp.mu.Unlock()
	return m.drv.on(m.ctx, func() error { return m.drv.err("cuMemFreeHost", m.drv.api.cuMemFreeHost(p)) })
}

// freePinnedCache frees the cached pinned buffers (Close).
func (m *Memory) freePinnedCache() error {
	pp := &m.pinned
	pp.mu.Lock()
	var all []unsafe.Pointer
	for _, list := range pp.cache {
		all = append(all, list...)
	}
	pp.cache, pp.cached = nil, 0
	pp.mu.Unlock()
	return m.drv.on(m.ctx, func() error {
		var err error
		for _, p := range all {
			if e := m.drv.err("cuMemFreeHost", m.drv.api.cuMemFreeHost(p)); e != nil {
				err = e
			}
		}
		return err
	})
}

// isPinned reports whether p lies wholly inside a pinned buffer of this
// memory, so the device can copy it by DMA directly.
func (m *Memory) isPinned(p []byte) bool {
	if len(p) == 0 {
		return false
	}
	start := uintptr(unsafe.Pointer(unsafe.SliceData(p)))
	end := start + uintptr(len(p))
	pp := &m.pinned
	pp.mu.Lock()
	defer pp.mu.Unlock()
	for base, n := range pp.live {
		if start >= base && end <= base+uintptr(n) {
			return true
		}
	}
	return false
}

// queueDMA queues one async copy between pinned host memory and the
// device at off on l's stream (the caller records its event).
func (b *Buffer) queueDMA(l *lane, off int64, host []byte, toDevice bool) error {
	a := &b.mem.drv.api
	hp := unsafe.Pointer(unsafe.SliceData(host))
	if toDevice {
		if r := a.cuMemcpyHtoDAsync(b.ptr+uint64(off), hp, uint64(len(host)), l.stream); r != Success {
			return b.mem.drv.err("cuMemcpyHtoDAsync_v2", r)
		}
		return nil
	}
	if r := a.cuMemcpyDtoHAsync(hp, b.ptr+uint64(off), uint64(len(host)), l.stream); r != Success {
		return b.mem.drv.err("cuMemcpyDtoHAsync_v2", r)
	}
	return nil
}

// direct copies between pinned host memory and the device in one DMA.
func (b *Buffer) direct(ctx context.Context, off int64, host []byte, toDevice bool) error {
	m := b.mem
	return m.run(ctx, func(l *lane) error {
		a := &m.drv.api
		if err := b.queueDMA(l, off, host, toDevice); err != nil {
			return err
		}
		if r := a.cuEventRecord(l.ev[0], l.stream); r != Success {
			a.cuStreamSynchronize(l.stream)
			return m.drv.err("cuEventRecord", r)
		}
		return m.wait(ctx, l.ev[0])
	})
}
