package tensor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"
)

// Slab memory: host memory for one trust scope, carved from large memfds.
//
// HostMemory backs every allocation with its own memfd, so a handle reaches
// one allocation and nothing else (share.go). That costs a reader one mmap
// and a page-table build per object, and the owner fresh pages per object
// (exported memory is never recycled). Ray's plasma store instead maps one
// large, pre-faulted region once per process. SlabMemory is that trade,
// opt-in and bounded by a trust scope: allocations are page-aligned ranges
// of a few large memfds (slabs); a read-only handle of an allocation is a
// descriptor of its whole slab with the allocation's offset and length
// (Handle.Slab), so a reader maps each slab once and reuses the mapping for
// every later object in it; and a released range is handed to a later
// allocation of the same SlabMemory, pages already populated.
//
// What a holder of a slab handle can see: every allocation of the same
// SlabMemory in that slab, for as long as it keeps the slab mapped,
// including what later allocations write into recycled ranges. That is
// acceptable only among processes that trust each other with all of the
// owner's objects anyway, which is what one SlabMemory stands for: its
// owner serves it only to readers of one trust scope (fabric/shm grants
// slab handles only to peers that proved the cluster key and passed the
// owner's authorization), and never mixes scopes in one SlabMemory. The
// other promises of Exportable still hold: a slab handle is read-only
// (sealed like any read-only export), slabs never shrink or grow, and
// Writable handles are refused (they would reach the neighbours).
// docs/security-shm-grants.md says more.
//
// A slab of Reserve bytes is created at NewSlabMemory and its pages
// populated in the background (WaitPopulated waits for them), so even the first transfer into (or out of)
// them pays no page population: the pre-faulted pool that a cold Get
// allocates its destination from.

// SlabConfig configures a SlabMemory. Zero values mean the documented
// defaults.
type SlabConfig struct {
	// Device is the memory's device; default HostDevice.
	Device DeviceID
	// SlabSize is the size of each slab; default 64 MiB. An allocation
	// larger than a slab gets a slab of its own size (page-rounded).
	SlabSize int64
	// Reserve is the size of a slab created at once and populated in the
	// background (the pre-faulted pool; like Ray's object store memory);
	// default 0, none.
	Reserve int64
	// Capacity caps the bytes of all slabs; 0 means unbounded.
	Capacity int64
	// Retain is how many bytes of wholly free slabs beyond Reserve are
	// kept mapped for reuse; default DefaultHostCache (1 GiB).
	Retain int64
	// Source, when set, supplies new slabs' memory with its pages already
	// resident (tensor/nodepool: a node's warm pool held by a process
	// that outlives the runtimes); when it has none, the slab is made
	// here, as without it (SlabMemory.SourceStats counts both).
	Source SlabSource
}

// SlabSource hands out memory files (memfds) whose pages are resident.
// Take returns a descriptor the caller owns, of a file of n >= size bytes
// whose size is not sealed, or an error when it has none.
type SlabSource interface {
	Take(ctx context.Context, size int64) (fd int, n int64, err error)
}

// DefaultSlabSize is SlabConfig.SlabSize's default.
const DefaultSlabSize = 64 << 20

// SlabMemory is host memory carved from large memfds shared, slab by slab,
// within one trust scope (see above). It is safe for concurrent use.
type SlabMemory struct {
	cfg SlabConfig

	mu     sync.Mutex
	slabs  []*slab
	bytes  int64 // in slabs
	used   int64
	held   int64 // bytes of ranges readers' views hold (Handle.Keep)
	peak   int64
	allocs int
	closed bool

	populating sync.WaitGroup
	stop       atomic.Bool
	created    atomic.Int64 // slabs ever created (a test and metrics hook)
	sourced    atomic.Int64 // of which from cfg.Source
	unsourced  atomic.Int64 // of which made here although cfg.Source is set
}

type slab struct {
	seg      *segment
	ranges   *rangeAllocator
	reserved bool // part of the start-up reserve: never unmapped before Close
	// populated marks the popChunk-sized chunks whose pages were
	// populated, so an allocation populates only what never was (a
	// populate call walks the page tables even when nothing is missing).
	populated []uint64
}

const popChunk = 2 << 20

// toPopulate marks the chunks [off, off+n) covers and returns the span of
// those that were not populated yet (n == 0: none); m.mu is held.
func (s *slab) toPopulate(off, n int64) (start, end int64) {
	first, last := off/popChunk, (off+n-1)/popChunk
	start, end = -1, 0
	for c := first; c <= last; c++ {
		w, bit := c/64, uint64(1)<<(c%64)
		if s.populated[w]&bit != 0 {
			continue
		}
		s.populated[w] |= bit
		if start < 0 {
			start = c * popChunk
		}
		end = min((c+1)*popChunk, int64(len(s.seg.data)))
	}
	if start < 0 {
		return 0, 0
	}
	return start, end
}

var _ Memory = (*SlabMemory)(nil)

// NewSlabMemory creates cfg.Reserve bytes of slabs and starts populating
// them in the background.
func NewSlabMemory(cfg SlabConfig) (*SlabMemory, error) {
	if cfg.Device == (DeviceID{}) {
		cfg.Device = HostDevice
	}
	if cfg.SlabSize <= 0 {
		cfg.SlabSize = DefaultSlabSize
	}
	cfg.SlabSize = pageRound(cfg.SlabSize)
	if cfg.Retain <= 0 {
		cfg.Retain = DefaultHostCache
	}
	if cfg.Reserve < 0 || cfg.Capacity < 0 {
		return nil, fmt.Errorf("tensor: slab memory: negative reserve %d or capacity %d", cfg.Reserve, cfg.Capacity)
	}
	if cfg.Capacity > 0 && cfg.Reserve > cfg.Capacity {
		return nil, fmt.Errorf("tensor: slab memory: reserve %d exceeds capacity %d", cfg.Reserve, cfg.Capacity)
	}
	m := &SlabMemory{cfg: cfg}
	if cfg.Reserve > 0 {
		// One slab for the whole reserve, so an allocation as large as
		// the reserve still finds its pages populated; a reader maps it
		// once all the same.
		s, err := m.newSlab(pageRound(cfg.Reserve))
		if err != nil {
			return nil, err
		}
		s.reserved = true
		s.toPopulate(0, int64(len(s.seg.data))) // populate does it
		m.slabs = append(m.slabs, s)
		m.bytes += int64(len(s.seg.data))
		m.populating.Add(1)
		go m.populate(s.seg)
	}
	return m, nil
}

// WaitPopulated waits until the reserve's pages are populated (or Close
// stopped it), or ctx ends.
func (m *SlabMemory) WaitPopulated(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		m.populating.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		m.stop.Store(true) // the waiter goroutine ends with the population
		<-done
		return ctx.Err()
	}
}

func (m *SlabMemory) newSlab(size int64) (*slab, error) {
	if m.cfg.Source != nil {
		if seg := m.fromSource(size); seg != nil {
			size = int64(len(seg.data))
			m.created.Add(1)
			m.sourced.Add(1)
			// Its pages are resident but not in this process's page
			// tables: Alloc's populate builds those (no page is zeroed).
			return &slab{seg: seg, ranges: newRangeAllocator(size), populated: make([]uint64, (size+popChunk*64-1)/(popChunk*64))}, nil
		}
		m.unsourced.Add(1)
	}
	seg, err := newSegment("tensorlane-slab", size, false)
	if err != nil {
		if errors.Is(err, unix.ENOMEM) || errors.Is(err, unix.ENOSPC) {
			return nil, &OutOfMemoryError{Device: m.cfg.Device, Requested: size}
		}
		return nil, fmt.Errorf("tensor: slab of %d bytes: %w", size, err)
	}
	m.created.Add(1)
	return &slab{seg: seg, ranges: newRangeAllocator(size), populated: make([]uint64, (size+popChunk*64-1)/(popChunk*64))}, nil
}

// fromSource takes a memory file of at least size bytes from cfg.Source
// and maps it as a segment, or returns nil. A file much larger than asked
// (more than a slab beyond it) is shrunk to size, its tail's pages given
// back; a smaller excess stays as free room in the slab.
func (m *SlabMemory) fromSource(size int64) *segment {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	fd, n, err := m.cfg.Source.Take(ctx, size)
	if err != nil {
		return nil
	}
	seg, err := adoptSegment(fd, n)
	if err != nil {
		unix.Close(fd)
		return nil
	}
	keep := n
	if n > size+m.cfg.SlabSize {
		keep = size
	}
	if err := seg.fit(keep); err != nil {
		seg.free()
		return nil
	}
	return seg
}

// SourceStats returns how many slabs came from SlabConfig.Source and how
// many were made here because it had none.
func (m *SlabMemory) SourceStats() (sourced, unsourced int64) {
	return m.sourced.Load(), m.unsourced.Load()
}

// populate makes the reserve's pages resident, a chunk at a time so Close
// need not wait for all of it. Allocations may use the slabs meanwhile:
// populating a page that is already written changes nothing.
func (m *SlabMemory) populate(s *segment) {
	defer m.populating.Done()
	const chunk = 16 << 20
	for off := 0; off < len(s.data); off += chunk {
		if m.stop.Load() {
			return
		}
		// Kernels before 5.14 lack it: the first use faults the pages.
		_ = unix.Madvise(s.data[off:min(off+chunk, len(s.data))], unix.MADV_POPULATE_WRITE)
	}
}

// Device returns the memory's device.
func (m *SlabMemory) Device() DeviceID { return m.cfg.Device }

// Slabs returns how many slabs were ever created (reused ranges create
// none).
func (m *SlabMemory) Slabs() int64 { return m.created.Load() }

// Held returns the bytes of ranges that readers' views hold (Handle.Keep),
// including ranges of buffers already released.
func (m *SlabMemory) Held() int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.held
}

// Alloc hands out n bytes: a free page-aligned range of an existing slab
// (memory released earlier in this SlabMemory, pages already populated),
// or of a new slab.
func (m *SlabMemory) Alloc(ctx context.Context, n int64) (Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("tensor: negative allocation %d on %v", n, m.cfg.Device)
	}
	b := &slabBuffer{mem: m, n: n}
	if n == 0 {
		return b, nil
	}
	size := pageRound(n)
	m.mu.Lock()
	if err := m.place(b, size); err != nil {
		m.mu.Unlock()
		return nil, err
	}
	var start, end int64
	if size >= 1<<20 {
		start, end = b.s.toPopulate(b.off, size)
	}
	m.mu.Unlock()
	if end > start {
		// Populating fresh pages costs more than the copy that fills them
		// (on several cores: populate.go); a chunk is populated once for
		// the slab's life.
		populateParallel(b.s.seg.data[start:end])
	}
	return b, nil
}

// place finds b a range of size bytes; m.mu is held.
func (m *SlabMemory) place(b *slabBuffer, size int64) error {
	n := b.n
	if m.closed {
		return ErrClosed
	}
	for _, s := range m.slabs {
		if off, ok := s.ranges.alloc(size); ok {
			b.s, b.off, b.size = s, off, size
			m.account(size)
			return nil
		}
	}
	want := max(size, m.cfg.SlabSize)
	if m.cfg.Capacity > 0 && m.bytes+want > m.cfg.Capacity {
		m.dropEmpty(0) // wholly free slabs make room
		if m.bytes+want > m.cfg.Capacity {
			want = size // a slab of just the allocation may still fit
		}
		if m.bytes+want > m.cfg.Capacity {
			return &OutOfMemoryError{Device: m.cfg.Device, Requested: n, Free: m.cfg.Capacity - m.used, LargestFree: m.largestFree()}
		}
	}
	s, err := m.newSlab(want)
	if err != nil {
		return err
	}
	m.slabs = append(m.slabs, s)
	m.bytes += want
	off, _ := s.ranges.alloc(size)
	b.s, b.off, b.size = s, off, size
	m.account(size)
	return nil
}

func (m *SlabMemory) account(size int64) {
	m.used += size
	m.allocs++
	m.peak = max(m.peak, m.used)
}

func (m *SlabMemory) largestFree() int64 {
	var l int64
	for _, s := range m.slabs {
		l = max(l, s.ranges.largestFree())
	}
	if m.cfg.Capacity > 0 {
		l = max(l, m.cfg.Capacity-m.bytes)
	}
	return l
}

// dropEmpty unmaps wholly free slabs outside the reserve until at most keep
// bytes of them remain; m.mu is held.
func (m *SlabMemory) dropEmpty(keep int64) {
	var kept int64
	out := m.slabs[:0]
	for _, s := range m.slabs {
		size := int64(len(s.seg.data))
		if s.reserved || s.ranges.used > 0 || kept+size <= keep {
			if !s.reserved && s.ranges.used == 0 {
				kept += size
			}
			out = append(out, s)
			continue
		}
		// Readers that mapped it keep their pages until they unmap; the
		// range is never handed out again.
		s.seg.free()
		m.bytes -= size
	}
	clear(m.slabs[len(out):])
	m.slabs = out
}

func (m *SlabMemory) release(b *slabBuffer) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.used -= b.size
	m.allocs--
	if b.holds == 0 {
		m.returnRange(b)
	}
}

// returnRange gives b's range back to its slab; m.mu is held.
func (m *SlabMemory) returnRange(b *slabBuffer) {
	b.returned = true
	b.s.ranges.release(b.off, b.size)
	switch {
	case m.closed && b.s.ranges.used == 0:
		m.dropEmpty(0)
	case b.s.ranges.used == 0 && !b.s.reserved:
		m.dropEmpty(m.cfg.Retain)
	}
}

// Stats reports use; Cached is the free bytes in slabs.
func (m *SlabMemory) Stats() MemStats {
	m.mu.Lock()
	defer m.mu.Unlock()
	s := MemStats{Device: m.cfg.Device, Backend: "slab", Capacity: m.cfg.Capacity, Used: m.used, Allocs: m.allocs, Peak: m.peak, Cached: m.bytes - m.used}
	if m.cfg.Capacity > 0 {
		s.Free = m.cfg.Capacity - m.used
		s.LargestFree = m.largestFree()
	}
	return s
}

// Close stops populating and unmaps the slabs that hold no live buffer;
// later allocations fail with ErrClosed. Live buffers stay usable, and
// their slab is unmapped with the last of them. Readers that mapped a slab
// keep its pages until they unmap. Idempotent.
func (m *SlabMemory) Close() error {
	m.stop.Store(true)
	m.populating.Wait()
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	for _, s := range m.slabs {
		s.reserved = false
	}
	m.dropEmpty(0)
	return nil
}

type slabBuffer struct {
	mem       *SlabMemory
	s         *slab // nil for an empty buffer
	off, size int64
	n         int64
	released  atomic.Bool

	// Guarded by mem.mu: readers' views holding the range (Handle.Keep),
	// and whether the range went back to the slab.
	holds    int
	returned bool
}

var (
	_ HostVisible = (*slabBuffer)(nil)
	_ Exportable  = (*slabBuffer)(nil)
)

func (b *slabBuffer) Device() DeviceID { return b.mem.cfg.Device }
func (b *slabBuffer) Len() int64       { return b.n }

func (b *slabBuffer) Bytes() []byte {
	if b.released.Load() {
		return nil
	}
	if b.s == nil {
		return []byte{}
	}
	return b.s.seg.data[b.off : b.off+b.n : b.off+b.n]
}

// Export shares the buffer's slab read-only, with the buffer's place in it
// (Handle.Slab). Writable is refused: it would reach the slab's other
// allocations.
func (b *slabBuffer) Export(a Access) (Handle, error) {
	if b.released.Load() {
		return Handle{}, ErrReleased
	}
	if b.s == nil {
		return Handle{}, fmt.Errorf("%w: an empty buffer has nothing to share", ErrNotExportable)
	}
	if a != ReadOnly {
		return Handle{}, fmt.Errorf("%w: slab memory is shared read-only within its trust scope; a %v handle would reach the slab's other allocations", ErrExportAccess, a)
	}
	h, err := b.s.seg.export(ReadOnly, int64(len(b.s.seg.data)))
	if err != nil {
		return Handle{}, fmt.Errorf("tensor: export slab buffer: %w", err)
	}
	h.Offset, h.Length, h.Slab = b.off, b.n, true
	h.Keep = b.keep
	return h, nil
}

// keep holds the buffer's range against reuse until release (see
// Handle.Keep). A range already back in its slab cannot be held: release
// is then a no-op, and the caller must not have released the buffer first
// (the shm server calls it while it pins the object).
func (b *slabBuffer) keep() func() {
	m := b.mem
	m.mu.Lock()
	defer m.mu.Unlock()
	if b.returned {
		return func() {}
	}
	b.holds++
	m.held += b.size
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			defer m.mu.Unlock()
			b.holds--
			m.held -= b.size
			if b.holds == 0 && b.released.Load() && !b.returned {
				m.returnRange(b)
			}
		})
	}
}

func (b *slabBuffer) Release() error {
	if b.released.Swap(true) {
		return nil
	}
	if b.s != nil {
		b.mem.release(b)
	}
	return nil
}

// SlabExporter is memory that can share its slabs whole, read-only, with
// readers of its trust scope before they ask for any object in them: the
// shm owner announces them, and a reader maps them and builds its page
// tables in the background, off the first transfer's critical path.
type SlabExporter interface {
	// ExportSlabs returns read-only handles (Handle.Slab, Offset 0,
	// Length 0) of at most max live slabs, largest first; the caller
	// closes their descriptors.
	ExportSlabs(max int) ([]Handle, error)
}

var _ SlabExporter = (*SlabMemory)(nil)

// ExportSlabs shares up to max of m's slabs whole, read-only and sealed,
// the reserve (the pool most allocations come from) first, then the
// larger. The same rule as Export holds: only readers of m's trust scope
// may get them (docs/security-shm-grants.md).
func (m *SlabMemory) ExportSlabs(max int) ([]Handle, error) {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil, ErrClosed
	}
	segs := make([]*slab, len(m.slabs))
	copy(segs, m.slabs)
	m.mu.Unlock()
	slices.SortStableFunc(segs, func(a, b *slab) int {
		if a.reserved != b.reserved {
			if a.reserved {
				return -1
			}
			return 1
		}
		return cmp.Compare(len(b.seg.data), len(a.seg.data))
	})
	var out []Handle
	for _, s := range segs[:min(max, len(segs))] {
		h, err := s.seg.export(ReadOnly, int64(len(s.seg.data)))
		if errors.Is(err, ErrReleased) {
			continue // dropped meanwhile
		}
		if err != nil {
			for _, o := range out {
				unix.Close(o.FD)
			}
			return nil, fmt.Errorf("tensor: export slab: %w", err)
		}
		h.Offset, h.Length, h.Slab = 0, 0, true
		out = append(out, h)
	}
	return out, nil
}
