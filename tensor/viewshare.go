package tensor

import (
	"context"
	"fmt"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// stageTimeout bounds the allocation of a view's private copy: Export has
// no context of its own (it runs under a transfer that has one, but the
// memory's Alloc must not outlive a stuck caller either).
const stageTimeout = 10 * time.Second

// ErrViewCopy is returned when a view's private copy cannot be made (no
// memory for it on the device, or memory the CPU cannot copy). It matches
// ErrNotExportable, so callers fall back to a path that needs no handle;
// an out-of-memory cause also matches ErrOutOfMemory.
var ErrViewCopy = fmt.Errorf("%w: no private copy of the view could be made", ErrNotExportable)

// ViewShare shares bytes [start, end) of a buffer (a view of it) with
// other processes without exposing the rest of the buffer's allocation.
//
// A handle reaches a whole allocation (see Exportable), so when the view
// does not cover its allocation, or does not start at its start, the
// ViewShare stages a private copy of exactly the view: once, on the first
// Export, into a fresh allocation of the same Memory (so it is accounted
// in that device's MemStats), and shares that copy read-only (sealed, as
// every read-only export is). This is what an owner does with CUDA too: a
// cuMemCreate handle reaches its whole allocation, so a slice is shared by
// copying it into an allocation of its own. The copy is a snapshot of the
// view taken at the first Export; it lives until Release. A view that is
// its whole allocation is exported as it is, with no copy.
//
// The methods are safe for concurrent use.
type ViewShare struct {
	mem        Memory
	src        Buffer
	start, end int64

	mu       sync.Mutex
	copy     Buffer // the private copy, once staged
	whole    bool   // src's allocation is the view: exported as it is
	released bool
}

// NewViewShare shares [start, end) of src, staging copies on mem (src's
// own memory). It allocates nothing until the first Export.
func NewViewShare(mem Memory, src Buffer, start, end int64) *ViewShare {
	return &ViewShare{mem: mem, src: src, start: start, end: end}
}

// Export returns a handle that reaches the view's bytes and nothing else
// of src's allocation. staged is the number of bytes this call copied (0
// unless it staged the private copy). A partial view can only be shared
// ReadOnly (writes into a copy would go nowhere): Writable returns an error
// matching ErrExportAccess. When the copy cannot be made the error matches
// ErrViewCopy (and so ErrNotExportable: callers fall back to a path that
// needs no handle), and ErrOutOfMemory when the device is full; a later
// Export tries again.
func (v *ViewShare) Export(a Access) (h Handle, staged int64, err error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.released {
		return Handle{}, 0, ErrReleased
	}
	if v.start < 0 || v.end < v.start || v.end > v.src.Len() {
		return Handle{}, 0, fmt.Errorf("%w: view [%d,%d) of a %d-byte buffer", ErrNotExportable, v.start, v.end, v.src.Len())
	}
	if v.copy == nil && (v.whole || v.start == 0 && v.end == v.src.Len()) {
		h, err := ExportOf(v.src, a)
		if err != nil {
			return h, 0, err
		}
		if h.Slab {
			// A slab is shared whole within its trust scope (slab.go):
			// a copy would hide nothing, so the view is exported in place.
			h.Offset += v.start
			h.Start, h.Length = v.start, v.end-v.start
			return h, 0, nil
		}
		// The buffer may itself be a view of a larger allocation (its
		// handle then starts past 0 or its file is larger than its
		// pages): stage then too.
		// A device allocation is rounded to the device's granularity (2
		// MiB for CUDA VMM): when the view is the whole buffer that owns
		// the allocation, the rest is that rounding, which holds no other
		// buffer's bytes.
		root, _ := Unwrap(v.src)
		ownsAll := h.Kind != HandleMemfd && root != nil && root.Len() == h.Length
		if h.Offset == 0 && (h.Size <= pageRound(h.Length) || ownsAll) {
			v.whole = true
			h.Length = min(h.Length, v.end)
			return h, 0, nil
		}
		unix.Close(h.FD)
	}
	if a != ReadOnly {
		return Handle{}, 0, fmt.Errorf("%w: a view of part of an allocation is shared as a read-only copy, not %v", ErrExportAccess, a)
	}
	if v.copy == nil {
		if staged, err = v.stage(); err != nil {
			return Handle{}, 0, err
		}
	}
	h, err = ExportOf(v.copy, ReadOnly)
	if err != nil {
		return h, 0, err
	}
	h.Start, h.Copy = v.start, true
	h.Length = v.end - v.start
	return h, staged, nil
}

// stage copies the view into a fresh allocation; v.mu is held.
func (v *ViewShare) stage() (int64, error) {
	n := v.end - v.start
	if IsDevice(v.src) {
		return v.stageDevice(n)
	}
	src, err := BytesOf(v.src)
	if err != nil {
		return 0, fmt.Errorf("%w: %v", ErrViewCopy, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), stageTimeout)
	defer cancel()
	b, err := v.mem.Alloc(ctx, n)
	if err != nil {
		return 0, fmt.Errorf("%w: %d bytes: %w", ErrViewCopy, n, err)
	}
	dst, err := BytesOf(b)
	if err != nil || int64(len(dst)) < n {
		b.Release()
		return 0, fmt.Errorf("%w: the copy is not host visible: %v", ErrViewCopy, err)
	}
	copy(dst, src[v.start:v.end])
	v.copy = b
	return n, nil
}

// stageDevice is stage for device memory (a slice of a GPU allocation):
// the copy is made by the device (Copy), never through the CPU.
func (v *ViewShare) stageDevice(n int64) (int64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), stageTimeout)
	defer cancel()
	b, err := v.mem.Alloc(ctx, n)
	if err != nil {
		return 0, fmt.Errorf("%w: %d bytes: %w", ErrViewCopy, n, err)
	}
	if err := Copy(ctx, b, 0, v.src, v.start, n); err != nil {
		b.Release()
		return 0, fmt.Errorf("%w: device copy: %w", ErrViewCopy, err)
	}
	v.copy = b
	return n, nil
}

// Staged returns the size of the private copy: 0 until one was staged, and
// after Release.
func (v *ViewShare) Staged() int64 {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.copy == nil {
		return 0
	}
	return v.copy.Len()
}

// Release frees the private copy (holders of its handles keep what they
// mapped, as with any exported allocation); src is the caller's to
// release. Export fails with ErrReleased afterwards. It is idempotent.
func (v *ViewShare) Release() error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.released = true
	if v.copy == nil {
		return nil
	}
	err := v.copy.Release()
	v.copy = nil
	if err != nil {
		return fmt.Errorf("tensor: release a view's private copy: %w", err)
	}
	return nil
}

// Src returns the buffer the view is of.
func (v *ViewShare) Src() Buffer { return v.src }
