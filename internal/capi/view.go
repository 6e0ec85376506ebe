package capi

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

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
	v   *rdt.View
	ref rdt.Ref
}

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
	r.mu.Lock()
	r.nextView++
	h := r.nextView
	r.views[h] = &heldView{v: v, ref: ref}
	r.mu.Unlock()
	return h, unsafe.Pointer(&p[0]), int64(len(p)), x, nil
}

// ReleaseView unmaps a view (once nothing else in this process uses the
// mapping). Releasing a handle twice is not an error.
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
