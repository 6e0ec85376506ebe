package rdt

import (
	"context"
	"fmt"
	"sync"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
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

	rt      *Runtime
	ref     Ref
	leased  bool // the view holds a use of its runtime's lease on ref
	key     holdKey
	revoked chan struct{}
	once    sync.Once
}

// Revoked is closed when the object behind the view was freed or its owner
// died: the bytes are no longer the object's and the view should be
// released.
func (v *View) Revoked() <-chan struct{} { return v.revoked }

// Release unmaps the view and ends the lease it kept (like a finished
// Get's, it goes a moment later unless the actor Holds the ref).
// Idempotent.
func (v *View) Release() error {
	var err error
	v.once.Do(func() {
		v.rt.views.remove(v)
		err = v.Tensor.Release()
		if v.leased {
			v.rt.unget(v.ref)
		}
	})
	return err
}

// View maps the ref's object read-only into this runtime, with a lease
// that keeps it alive, or fails with ErrNoZeroCopy when no path can map it
// (another host): use Get then.
func (a *Actor) View(ctx context.Context, ref Ref) (*View, error) {
	r := a.rt
	if r.isClosed() {
		return nil, ErrClosed
	}
	if err := ref.Desc.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrMalformedRef, err)
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	remote := r.remoteFor(ref)
	plan := r.planner.PlanView(remote, r.endpoint(ref.Device))
	if plan.Chosen == "" {
		return nil, fmt.Errorf("%w: %v from %s", ErrNoZeroCopy, ref, r.cfg.Host)
	}
	ctx, unguard, err := r.guard(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unguard()
	buf, st, err := r.planner.RunView(ctx, &plan, remote)
	if err != nil {
		return nil, r.why(ctx, ref, err)
	}
	desc := ref.Desc
	if ref.Owner != r.host.ID() {
		desc = desc.Rebased() // the shared view starts at the tensor's first byte
	}
	t, err := tensor.New(buf, desc)
	if err != nil {
		buf.Release()
		return nil, err
	}
	v := &View{Tensor: t, rt: r, key: keyOf(ref), revoked: make(chan struct{}),
		Transfer: Transfer{Plan: plan, Stats: st}}
	if ref.Owner != r.host.ID() {
		// The view keeps the lease the Get-like guard took, until its
		// Release (lease.go: a lease with a use outlives its Get).
		v.ref, v.leased = ref, r.keepGetHold(ref)
		r.views.add(v)
		if !r.holding(v.key) { // freed or dead between the lease and now
			r.views.revoke(v.key)
		}
	}
	return v, nil
}

// holding reports whether this runtime still holds a lease for k.
func (r *Runtime) holding(k holdKey) bool { return r.leases.Held(k) }

// viewTable tracks live views by the lease that keeps their object alive.
type viewTable struct {
	mu sync.Mutex
	m  map[holdKey]map[*View]struct{}
}

func (t *viewTable) add(v *View) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[holdKey]map[*View]struct{}{}
	}
	if t.m[v.key] == nil {
		t.m[v.key] = map[*View]struct{}{}
	}
	t.m[v.key][v] = struct{}{}
}

func (t *viewTable) remove(v *View) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m[v.key], v)
	if len(t.m[v.key]) == 0 {
		delete(t.m, v.key)
	}
}

// revoke closes Revoked of every view of k: its lease is gone.
func (t *viewTable) revoke(k holdKey) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for v := range t.m[k] {
		select {
		case <-v.revoked:
		default:
			close(v.revoked)
		}
	}
}
