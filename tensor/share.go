package tensor

import (
	"errors"
	"fmt"
)

// Sharing one allocation with another process.
//
// An Exportable buffer hands out a Handle: a file descriptor that reaches
// exactly the memory of the allocation the buffer lives in, and nothing
// else, with the Access it was asked for. It is the analogue of CUDA's VMM
// handles (cuMemCreate, then cuMemExportToShareableHandle with a POSIX fd:
// one shareable handle per allocation), not of a handle to a whole pool.
// The transports that map another process's memory (fabric/shm's "shm"
// and "p2p", zero-copy on-host reads) rely on these promises, and every
// implementation (HostMemory, SimMemory, a CUDA backend) must keep them:
//
//   - One allocation per handle. The file behind Handle.FD holds the
//     allocation's bytes (page-rounded) and nothing of any other
//     allocation, past or future: mapping the whole file, or reading it
//     with pread, shows only this allocation. A buffer that is a view of a
//     larger allocation exports that allocation, with Offset and Length
//     naming the view inside it (the granularity CUDA has too); an owner
//     that must not expose the rest of the allocation shares a private
//     copy of the view instead (ViewShare).
//   - ReadOnly means read-only. The descriptor is opened read-only, so it
//     cannot be mapped writable, written or truncated; the file refuses to
//     be reopened for writing (through /proc/self/fd/N or /proc/PID/fd/N)
//     by a process of the same user that lacks CAP_DAC_OVERRIDE (its mode
//     is 0400); and, where the kernel has F_SEAL_FUTURE_WRITE (5.1+), a
//     read-only export also seals the file against every new write or
//     writable mapping, so even a process that can reopen it (root) cannot
//     write through it. The owner's own mapping, made at allocation, stays
//     writable.
//   - Writable reaches only its allocation. A Writable handle can be
//     mapped writable (and so readable: the CPU has no write-only pages),
//     but the file is the allocation alone, so the holder can write into
//     that slot and nowhere else, and read only what the slot holds.
//   - Sizes are fixed. The file is sealed against shrinking and growing,
//     so no holder can truncate it under the owner's mapping (which would
//     fault the owner).
//   - Revocation by never recycling. Memory that was ever exported is
//     never handed to another allocation (except in SlabMemory, opt-in:
//     within one trust scope, see slab.go): Release closes the owner's
//     descriptor and mapping, and the pages are freed by the kernel once
//     the last holder closes its descriptor and unmaps. So a former holder
//     that keeps a mapping after Release sees the freed object's bytes (or
//     nothing), never the bytes of whatever is allocated next. Holders
//     should still re-validate before trusting the bytes (fabric/shm asks
//     the owner, who pins the object for each copy) and unmap early, since
//     the memory stays resident as long as they map it.
//
// Not covered: a process of the same user that may ptrace the owner, or
// root, can read and write the owner's memory directly (process_vm_writev,
// /proc/PID/mem) whatever the handles say; docs/security-shm-grants.md
// says what such a process can still do.

// Access is what a Handle lets its holder do with the allocation's bytes.
type Access uint8

const (
	// ReadOnly is for pulls: the holder may map and read the allocation.
	ReadOnly Access = 1
	// Writable is for pushes into a slot: the holder may map the
	// allocation writable (which on every CPU also lets it read it).
	Writable Access = 2
)

func (a Access) String() string {
	switch a {
	case ReadOnly:
		return "read-only"
	case Writable:
		return "writable"
	}
	return fmt.Sprintf("access(%d)", uint8(a))
}

// Handle is one allocation exported for another process (see Exportable).
type Handle struct {
	// FD is a descriptor of a file that holds this allocation and nothing
	// else. It is owned by the caller of Export, who must close it.
	FD int
	// Size is the size of the file behind FD: the allocation, page-rounded.
	Size int64
	// Offset and Length place the buffer's bytes in the file: 0 and the
	// buffer's length unless the buffer is a view of a larger allocation.
	Offset int64
	Length int64
	// Start is the buffer byte found at Offset: 0, unless the file holds
	// only part of the buffer (a private copy of a view, see ViewShare),
	// in which case the file holds bytes [Start, Start+Length) of the
	// buffer and none of the others.
	Start int64
	// Copy is set when the file is a private copy of the buffer's bytes
	// (a view's, see ViewShare), not the buffer's own memory: writes to
	// the buffer after the copy was made do not show in it.
	Copy bool
	// Slab is set when the file is a slab of a SlabMemory: it holds other
	// allocations of the same owner and trust scope too (Offset and Length
	// place this one), and a holder may map it once for all of them.
	Slab bool
	// Keep, for slab handles, holds the allocation's range against reuse
	// until the returned release is called, even after the buffer is
	// released: a reader's zero-copy view of it must not see the range
	// handed to another allocation while it lives. nil for other handles
	// (their memory is never recycled once exported).
	Keep func() (release func())
	// Access is what FD allows.
	Access Access
	// Kind says what FD is: a memory file (the zero value), or a device
	// allocation's own handle (CUDA), which the receiver imports
	// (Import) instead of mapping. For a CUDA handle Access is what the
	// importer is asked to map: the driver's descriptor itself does not
	// enforce it (see tensor/cuda).
	Kind HandleKind
	// Device is the exporting device.
	Device DeviceID
	// ID names a device allocation for the lifetime of its process (a
	// serial, never reused), so a receiver can tell a repeated grant of
	// the allocation it imported already; 0 for memory files, which their
	// file identity names.
	ID uint64
}

// Exportable is the optional capability of buffers whose allocation can be
// shared with another process, one allocation per handle, with the
// guarantees described above (ReadOnly handles cannot write, Writable ones
// reach only their allocation, exported memory is never recycled).
//
// Export returns ErrReleased after Release, and an error matching
// ErrExportAccess when the allocation cannot be shared with that access
// (for example Writable after it was shared ReadOnly and sealed, or
// ReadOnly where no read-only descriptor can be made).
type Exportable interface {
	Export(access Access) (Handle, error)
}

// ErrNotExportable is returned by ExportOf for memory that cannot be
// shared with another process.
var ErrNotExportable = errors.New("tensor: memory cannot be shared with another process")

// ErrExportAccess is returned when an allocation cannot be shared with the
// access asked for. It matches ErrNotExportable too, so callers that fall
// back to another path on one fall back on both.
var ErrExportAccess = fmt.Errorf("%w with the access asked for", ErrNotExportable)

// ExportOf exports b's allocation with access (see Exportable), or returns
// an error matching ErrNotExportable when its memory cannot be shared.
func ExportOf(b Buffer, access Access) (Handle, error) {
	if access != ReadOnly && access != Writable {
		return Handle{}, fmt.Errorf("%w: unknown %v", ErrExportAccess, access)
	}
	e, ok := b.(Exportable)
	if !ok {
		return Handle{}, fmt.Errorf("%w: buffer on %v", ErrNotExportable, b.Device())
	}
	return e.Export(access)
}
