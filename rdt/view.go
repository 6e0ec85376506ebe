package rdt

import (
	"context"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/reader"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Zero-copy on one host. A reader on the owner's host (another runtime,
// another process) can map the object read-only and use it in place
// instead of copying it: the CUDA IPC analogue, and what Ray's zero-copy
// object store does for numpy arrays. The reader allocates nothing, so the
// first read costs no page population and the time does not depend on the
// size. The reader's lease keeps the object alive for as long as the view
// is held; when the owner Frees it (or dies), the view is revoked: Revoked
// is closed once the reader's runtime learns it (at the next lease renewal
// or death detection), and the memory is never handed to another
// allocation meanwhile (tensor.Exportable), so a view never shows another
// object's bytes.

// ErrNoZeroCopy: no path can map the object into this runtime (another
// host, or memory that cannot be shared); Get copies it instead.
var ErrNoZeroCopy = errs.NoZeroCopy

// View is a read-only, zero-copy view of an object on this host.
type View struct {
	// Tensor is the object's tensor, mapped read-only: writing to its
	// bytes faults. Valid until Release.
	Tensor   tensor.Tensor
	Transfer Transfer

	v *reader.View
}

// Revoked is closed when the object behind the view was freed or its owner
// died: the bytes are no longer the object's and the view should be
// released.
func (v *View) Revoked() <-chan struct{} { return v.v.Revoked() }

// Release unmaps the view and ends the lease it kept (like a finished
// Get's, it goes a moment later unless the actor Holds the ref).
// Idempotent.
func (v *View) Release() error { return v.v.Release() }

// View maps the ref's object read-only into this runtime, with a lease
// that keeps it alive, or fails with ErrNoZeroCopy when no path can map it
// (another host): use Get then.
func (a *Actor) View(ctx context.Context, ref Ref) (*View, error) {
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	v, err := a.rt.reader.View(ctx, refwire.Ref(ref), a.rt.cfg.Host)
	if err != nil {
		return nil, err
	}
	return &View{Tensor: v.Tensor, Transfer: transfer(v.Result), v: v}, nil
}
