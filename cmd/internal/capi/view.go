package capi

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt"
)

// Zero-copy reads. View maps a same-host object read-only into this
// process instead of copying it (rdt.Actor.View): the reader allocates
// nothing and copies nothing, as Ray's object store does for numpy arrays.
// The mapping lives until ReleaseView, whatever the owner does meanwhile:
// once the owner frees the object its memory is never handed to another
// allocation (tensor.Exportable), so a view that outlives its object keeps
// showing that object's bytes and never another's.

// ErrNoZeroCopy: no path maps the object here (another host, or transports
// that cannot share memory); read it with Get instead.
var ErrNoZeroCopy = rdt.ErrNoZeroCopy

// ViewConfig tunes one View. The zero value maps lazily.
type ViewConfig struct {
	// Populate builds the mapping's page tables in the call
	// (MADV_POPULATE_READ), so a reader that touches every byte does not
	// take a fault per page; it costs time in proportion to the size.
	Populate bool
}

// heldView is a live view behind a handle.
type heldView struct {
	v    *rdt.View
	ref  rdt.Ref
	span []byte // the mapped bytes handed to the caller
}

// viewHandles numbers views across every runtime of the process, so a
// handle names one view only: given to another runtime's ReleaseView it
// matches nothing there (it used to count from 1 in each runtime, so one
// runtime's handle released another's view).
var viewHandles atomic.Uint64

// View maps the ref's tensor read-only and returns a handle for
// ReleaseView, the address of its first byte and its span in bytes. Writing
// through the address faults. Like Get it takes a lease on the owner (drop
// it with Release when done with the ref; the mapping stays valid until
// ReleaseView either way). It fails with an error matching ErrNoZeroCopy
// when no path can map the object; the caller then copies with Get.
func (r *Runtime) View(ctx context.Context, refBytes []byte, cfg ViewConfig, op uint64, timeout time.Duration) (uint64, unsafe.Pointer, int64, rdt.Transfer, error) {
	ref, err := parseRef(refBytes)
	if err != nil {
		return 0, nil, 0, rdt.Transfer{}, err
	}
	if _, n := spanOf(ref.Desc); n == 0 {
		return 0, nil, 0, rdt.Transfer{}, invalid("the object is empty")
	}
	if ref.Owner == r.rt.ID() {
		// The runtime's own object: a view would be the owner's memory
		// itself, pinned (Free would wait for its release, and Close for
		// its whole grace), and writable through the array it was
		// published from. The caller has the bytes already; Get copies.
		return 0, nil, 0, rdt.Transfer{}, fmt.Errorf("%w: %v is this runtime's own object (use the array it was published from, or Get for a copy)", ErrNoZeroCopy, ref)
	}
	ctx, done := r.begin(ctx, op, timeout)
	defer done()
	start := time.Now()
	v, err := r.actor.View(ctx, ref)
	if err != nil {
		if !errors.Is(err, rdt.ErrNoZeroCopy) {
			r.count(rdt.Transfer{}, start, err)
		}
		return 0, nil, 0, rdt.Transfer{}, err
	}
	p, err := v.Tensor.SpanBytes()
	if err == nil && len(p) == 0 {
		err = fmt.Errorf("the view of %v holds no bytes", ref)
	}
	if err != nil {
		v.Release()
		return 0, nil, 0, rdt.Transfer{}, err
	}
	if cfg.Populate && !r.slabs {
		// (A view of a slab object comes with its page tables, built
		// once per slab chunk: fabric/shm's slab.go.)
		populateRead(p)
	}
	x := v.Transfer
	r.count(x, start, nil)
	r.stats.views.Add(1)
	h := viewHandles.Add(1)
	r.mu.Lock()
	r.views[h] = &heldView{v: v, ref: ref, span: p}
	r.mu.Unlock()
	return h, unsafe.Pointer(&p[0]), int64(len(p)), x, nil
}

// ReleaseView unmaps a view (once nothing else in this process uses the
// mapping). Releasing a handle twice, or one this runtime never gave out,
// is not an error and releases nothing.
func (r *Runtime) ReleaseView(h uint64) error {
	r.mu.Lock()
	hv, ok := r.views[h]
	delete(r.views, h)
	r.mu.Unlock()
	if !ok {
		return nil
	}
	return hv.v.Release()
}

// detachViews makes every live view's bytes private to this process, at
// shutdown, before the runtime's leases go: the owner then takes back what
// the views held (in slab mode it reuses the ranges for other objects), so
// a mapping of its memory would start showing other bytes, while the
// caller was promised the object's until ReleaseView. Each view's pages
// are copied into anonymous memory that replaces the shared pages at the
// same address in one mremap, so a reader in another thread never sees a
// hole. It costs a copy of the live views' bytes; views released before
// Close cost nothing. A view whose copy fails (its owner truncated the
// file under it) keeps its shared mapping; the errors are returned.
func (r *Runtime) detachViews() error {
	r.mu.Lock()
	spans := make([][]byte, 0, len(r.views))
	for _, hv := range r.views {
		spans = append(spans, hv.span)
	}
	r.mu.Unlock()
	var errs []error
	for _, p := range spans {
		if err := privatize(p); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// privatize replaces the pages under p with a private, read-only copy of
// them (see detachViews).
func privatize(p []byte) (err error) {
	if len(p) == 0 {
		return nil
	}
	page := uintptr(unix.Getpagesize())
	lead := uintptr(unsafe.Pointer(&p[0])) & (page - 1)
	n := (lead + uintptr(len(p)) + page - 1) &^ (page - 1)
	start := unsafe.Add(unsafe.Pointer(&p[0]), -int(lead))
	tmp, err := unix.MmapPtr(-1, 0, nil, n, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("capi: copy of a view at close: %w", err)
	}
	moved := false
	defer func() {
		if !moved {
			unix.MunmapPtr(tmp, n)
		}
	}()
	if err := copyGuarded(unsafe.Slice((*byte)(tmp), n), unsafe.Slice((*byte)(start), n)); err != nil {
		return err
	}
	if err := unix.Mprotect(unsafe.Slice((*byte)(tmp), n), unix.PROT_READ); err != nil {
		return fmt.Errorf("capi: copy of a view at close: %w", err)
	}
	if _, err := unix.MremapPtr(tmp, n, start, n, unix.MREMAP_MAYMOVE|unix.MREMAP_FIXED); err != nil {
		return fmt.Errorf("capi: copy of a view at close: %w", err)
	}
	moved = true
	return nil
}

// copyGuarded copies a mapping of another process's file: a fault (the
// file shrank under it) is an error, not a crash.
func copyGuarded(to, from []byte) (err error) {
	defer debug.SetPanicOnFault(debug.SetPanicOnFault(true))
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%w: the owner's memory faulted while a view was copied: %v", fabric.ErrCorrupt, r)
		}
	}()
	copy(to, from)
	return nil
}

// Views is the number of views this runtime holds.
func (r *Runtime) Views() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.views)
}

// populateRead builds p's page tables in one call (Linux 5.14+; older
// kernels fault the pages on first touch instead). madvise wants a
// page-aligned start.
func populateRead(p []byte) {
	if len(p) < 64<<10 {
		return // a few pages: faulting them costs less than the call
	}
	addr := uintptr(unsafe.Pointer(&p[0]))
	page := uintptr(unix.Getpagesize())
	lead := addr & (page - 1)
	whole := unsafe.Slice((*byte)(unsafe.Add(unsafe.Pointer(&p[0]), -int(lead))), len(p)+int(lead))
	_ = unix.Madvise(whole, unix.MADV_POPULATE_READ)
}
