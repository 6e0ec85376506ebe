package tensor

import (
	"errors"
	"fmt"
	"strconv"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"
)

// segment is one allocation's own memory file (a memfd) and this process's
// writable mapping of it: the unit an Exportable buffer exports (see
// share.go). HostMemory and SimMemory back every non-empty allocation with
// one, so a handle never reaches another allocation's memory.
type segment struct {
	fd   int
	ro   int    // a read-only open of fd, made at the first read-only export; -1 before
	data []byte // the whole mapping (page-rounded)

	mu       sync.Mutex
	exported bool // a handle was made: never recycle, another process may map it
	sealed   bool // F_SEAL_FUTURE_WRITE is set (shared read-only)
	writable bool // a writable handle was made: it cannot be sealed read-only
	// untracked: data was mapped with MmapPtr (newSegmentSealed without
	// sealSize), so fit can unmap its tail; free unmaps it the same way.
	untracked bool
}

// newSegment creates a memfd of size bytes (page-rounded by the caller),
// maps it writable and, when populate is set, makes its pages resident.
//
// The file refuses what a holder of an exported descriptor should never
// do: its mode is 0400, so a process of our user without CAP_DAC_OVERRIDE
// cannot reopen it for writing through /proc/.../fd (the owner keeps the
// read-write descriptor it created it with, and a read-only reopen is
// still allowed); and it is sealed against shrinking and growing, so
// nobody can truncate it under the owner's mapping (a SIGBUS in the owner).
func newSegment(name string, size int64, populate bool) (*segment, error) {
	return newSegmentSealed(name, size, populate, true)
}

// newSegmentSealed is newSegment; without sealSize the file's size is not
// sealed yet (a reserve whose size fit sets when an allocation takes it).
func newSegmentSealed(name string, size int64, populate, sealSize bool) (*segment, error) {
	fd, err := unix.MemfdCreate(name, unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) {
		return nil, fmt.Errorf("memfd: %w (every live allocation holds one descriptor: raise RLIMIT_NOFILE)", err)
	}
	if err != nil {
		return nil, fmt.Errorf("memfd: %w", err)
	}
	fail := func(what string, err error) (*segment, error) {
		unix.Close(fd)
		return nil, fmt.Errorf("%s: %w", what, err)
	}
	if err := unix.Ftruncate(fd, size); err != nil {
		return fail("size memfd", err)
	}
	if err := unix.Fchmod(fd, 0o400); err != nil {
		return fail("make memfd read-only to reopeners", err)
	}
	if sealSize {
		if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
			return fail("seal memfd size", err)
		}
	}
	var data []byte
	if sealSize {
		data, err = unix.Mmap(fd, 0, int(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	} else {
		// Mapped outside x/sys's bookkeeping, which unmaps only whole
		// mappings: fit unmaps this one's tail.
		var ptr unsafe.Pointer
		ptr, err = unix.MmapPtr(fd, 0, nil, uintptr(size), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
		if err == nil {
			data = unsafe.Slice((*byte)(ptr), size)
		}
	}
	if err != nil {
		// ENOMEM here may also be vm.max_map_count: one mapping per live
		// allocation.
		return fail("map memfd", err)
	}
	AdviseHuge(data)
	if populate {
		// Device memory is resident once allocated; populating now keeps
		// page faults out of the transfers that measure copies. Kernels
		// without MADV_POPULATE_WRITE (before 5.14) fault on first touch.
		_ = unix.Madvise(data, unix.MADV_POPULATE_WRITE)
	}
	return &segment{fd: fd, ro: -1, data: data, untracked: !sealSize}, nil
}

// adoptSegment maps a memory file made elsewhere (a node pool's, see
// SlabConfig.Source) of n bytes, its size not sealed yet, as a segment
// made without size seals: fit seals it. The file must be a memfd that
// allows sealing, as newSegment's are; its mode is made 0400 as theirs.
func adoptSegment(fd int, n int64) (*segment, error) {
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return nil, fmt.Errorf("stat adopted memfd: %w", err)
	}
	if st.Size != n || n <= 0 || n%pageSize != 0 {
		return nil, fmt.Errorf("tensor: adopted memfd holds %d bytes, want %d (page-rounded)", st.Size, n)
	}
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil || seals&(unix.F_SEAL_SEAL|unix.F_SEAL_WRITE|unix.F_SEAL_FUTURE_WRITE|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW) != 0 {
		return nil, fmt.Errorf("tensor: adopted file is not an unsealed memfd (seals %#x): %v", seals, err)
	}
	if err := unix.Fchmod(fd, 0o400); err != nil {
		return nil, fmt.Errorf("make adopted memfd read-only to reopeners: %w", err)
	}
	ptr, err := unix.MmapPtr(fd, 0, nil, uintptr(n), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("map adopted memfd: %w", err)
	}
	data := unsafe.Slice((*byte)(ptr), n)
	AdviseHuge(data)
	return &segment{fd: fd, ro: -1, data: data, untracked: true}, nil
}

// fit shrinks a segment made without size seals to size bytes (page
// rounded, at most its size), giving the pages past it back, and seals its
// size as newSegment does. The mapping keeps its length (the tail is
// never touched: data ends at size), so free unmaps all of it.
func (s *segment) fit(size int64) error {
	if size < int64(len(s.data)) {
		if !s.untracked {
			return fmt.Errorf("tensor: only an unsealed segment can shrink")
		}
		// The tail's mapping first: touching it past the file's end would
		// fault (SIGBUS).
		if err := unix.MunmapPtr(unsafe.Pointer(&s.data[size]), uintptr(int64(len(s.data))-size)); err != nil {
			return fmt.Errorf("unmap memfd tail: %w", err)
		}
		s.data = s.data[:size:size]
		if err := unix.Ftruncate(s.fd, size); err != nil {
			return fmt.Errorf("shrink memfd: %w", err)
		}
	}
	if _, err := unix.FcntlInt(uintptr(s.fd), unix.F_ADD_SEALS, unix.F_SEAL_SHRINK|unix.F_SEAL_GROW); err != nil {
		return fmt.Errorf("seal memfd size: %w", err)
	}
	return nil
}

// export makes a handle of the segment for another process. n is the
// buffer's length: on the first export the page tail past it, which a
// recycled segment may still hold from an earlier allocation, is zeroed,
// since the holder maps whole pages.
func (s *segment) export(a Access, n int64) (Handle, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data == nil {
		return Handle{}, ErrReleased
	}
	var fd int
	switch a {
	case ReadOnly:
		if s.ro < 0 {
			// A new open file description, read-only: the only way to turn
			// our read-write memfd into a descriptor that cannot write. It
			// needs /proc; without it there is no safe descriptor to give.
			// It is kept, so later exports (one per transfer) only dup it.
			ro, err := unix.Open("/proc/self/fd/"+strconv.Itoa(s.fd), unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				return Handle{}, fmt.Errorf("%w: no read-only descriptor of the allocation (is /proc mounted?): %v", ErrExportAccess, err)
			}
			s.ro = ro
		}
		var err error
		fd, err = unix.FcntlInt(uintptr(s.ro), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return Handle{}, fmt.Errorf("tensor: export allocation: %w", err)
		}
		if !s.sealed && !s.writable {
			// From now on nobody, root included, can write the file or map
			// it writable; our own mapping, made before, stays writable.
			_, err := unix.FcntlInt(uintptr(s.fd), unix.F_ADD_SEALS, unix.F_SEAL_FUTURE_WRITE)
			switch {
			case err == nil:
				s.sealed = true
			case errors.Is(err, unix.EINVAL):
				// A kernel before 5.1: the read-only descriptor and the
				// file mode still refuse writes to everyone but root.
			default:
				unix.Close(fd)
				return Handle{}, fmt.Errorf("tensor: seal shared allocation read-only: %w", err)
			}
		}
	case Writable:
		if s.sealed {
			return Handle{}, fmt.Errorf("%w: the allocation was shared read-only and is sealed against writes", ErrExportAccess)
		}
		var err error
		fd, err = unix.FcntlInt(uintptr(s.fd), unix.F_DUPFD_CLOEXEC, 0)
		if err != nil {
			return Handle{}, fmt.Errorf("tensor: export allocation: %w", err)
		}
		s.writable = true
	default:
		return Handle{}, fmt.Errorf("%w: unknown %v", ErrExportAccess, a)
	}
	if !s.exported {
		clear(s.data[min(n, int64(len(s.data))):])
		s.exported = true
	}
	return Handle{FD: fd, Size: int64(len(s.data)), Offset: 0, Length: n, Access: a}, nil
}

// wasExported reports whether a handle was ever made (so the segment must
// not be recycled).
func (s *segment) wasExported() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.exported
}

// free unmaps the segment and closes our descriptor. Holders of handles
// keep the memory (and only it) alive until they close and unmap.
func (s *segment) free() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.data == nil {
		return nil
	}
	var err error
	if s.untracked {
		err = unix.MunmapPtr(unsafe.Pointer(&s.data[0]), uintptr(len(s.data)))
	} else {
		err = unix.Munmap(s.data)
	}
	if cerr := unix.Close(s.fd); err == nil {
		err = cerr
	}
	if s.ro >= 0 {
		unix.Close(s.ro)
	}
	s.data, s.fd, s.ro = nil, -1, -1
	return err
}

// segmentCache keeps released, never-exported segments by size for reuse:
// populating fresh pages costs more than copying into them, so a loop of
// allocations of one size touches new pages once. It is not safe for
// concurrent use; the owning memory locks around it.
type segmentCache struct {
	bySize map[int64][]*segment
	bytes  int64
	limit  int64
}

// take returns a cached segment of size bytes, or nil.
func (c *segmentCache) take(size int64) *segment {
	list := c.bySize[size]
	if len(list) == 0 {
		return nil
	}
	s := list[len(list)-1]
	c.bySize[size] = list[:len(list)-1]
	c.bytes -= size
	return s
}

// put keeps s if it was never exported and fits the limit, and reports
// whether it did.
func (c *segmentCache) put(s *segment) bool {
	size := int64(len(s.data))
	if s.wasExported() || c.bytes+size > c.limit {
		return false
	}
	if c.bySize == nil {
		c.bySize = map[int64][]*segment{}
	}
	c.bySize[size] = append(c.bySize[size], s)
	c.bytes += size
	return true
}

// trim takes segments out until the cache fits its limit and returns them
// for freeing outside the lock.
func (c *segmentCache) trim() []*segment {
	var drop []*segment
	for size, list := range c.bySize {
		for len(list) > 0 && c.bytes > c.limit {
			drop = append(drop, list[len(list)-1])
			list = list[:len(list)-1]
			c.bytes -= size
		}
		if len(list) == 0 {
			delete(c.bySize, size)
		} else {
			c.bySize[size] = list
		}
	}
	return drop
}

func freeAll(segs []*segment) error {
	var errs []error
	for _, s := range segs {
		errs = append(errs, s.free())
	}
	return errors.Join(errs...)
}

// hugePage is the size of a transparent huge page on the platforms we run.
const hugePage = 2 << 20

// AdviseHuge asks for transparent huge pages on a shared mapping of 2 MiB
// or more (an owner's allocation, a reader's mapping of its grant): where
// the kernel allows them for shared memory
// (/sys/kernel/mm/transparent_hugepage/shmem_enabled "advise" or more),
// populating it and every reader's page tables cost 512 times fewer
// entries, which is most of a cold transfer's cost. Elsewhere it does
// nothing, and a refusal is not an error.
func AdviseHuge(data []byte) {
	if len(data) >= hugePage {
		_ = unix.Madvise(data, unix.MADV_HUGEPAGE)
	}
}
