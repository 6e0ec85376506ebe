package reader

import (
	"context"
	"fmt"
	"sync"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/leases"
	"github.com/tensorlane/tensorlane/tensor"
)

// View is a read-only, zero-copy view of an object on this host, with a
// use of the lease that keeps the object alive (rdt.View).
type View struct {
	Tensor tensor.Tensor
	Result Result

	r       *Reader
	ref     Ref
	leased  bool // the view holds a use of its runtime's lease on ref
	key     leases.Key
	revoked chan struct{}
	once    sync.Once
}

// Revoked is closed when the object behind the view was freed or its
// owner died.
func (v *View) Revoked() <-chan struct{} { return v.revoked }

// Release unmaps the view and ends its use of the lease. Idempotent.
func (v *View) Release() error {
	var err error
	v.once.Do(func() {
		v.r.views.remove(v)
		err = v.Tensor.Release()
		if v.leased {
			v.r.unget(v.ref)
		}
	})
	return err
}

// View maps ref's object read-only into this runtime, with a lease that
// keeps it alive, or fails with errs.NoZeroCopy when no path can map it
// (another host). host names this runtime's host in that error.
func (r *Reader) View(ctx context.Context, ref Ref, host string) (*View, error) {
	if r.env.Closed() {
		return nil, errs.Closed
	}
	if err := ref.Desc.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %v", errs.MalformedRef, err)
	}
	remote := Remote(ref)
	plan := r.d.Planner.PlanView(remote, r.env.Endpoint(ref.Device))
	if plan.Chosen == "" {
		return nil, fmt.Errorf("%w: %v from %s", errs.NoZeroCopy, ref, host)
	}
	ctx, unguard, err := r.Guard(ctx, ref)
	if err != nil {
		return nil, err
	}
	defer unguard()
	buf, st, err := r.d.Planner.RunView(ctx, &plan, remote)
	if err != nil {
		return nil, r.Why(ctx, ref, err)
	}
	desc := ref.Desc
	if !r.own(ref) {
		desc = desc.Rebased() // the shared view starts at the tensor's first byte
	}
	t, err := tensor.New(buf, desc)
	if err != nil {
		buf.Release()
		return nil, err
	}
	v := &View{Tensor: t, r: r, key: leases.KeyOf(ref), revoked: make(chan struct{}),
		Result: Result{Plan: plan, Stats: st}}
	if !r.own(ref) {
		// The view keeps the lease Guard took, until its Release (a
		// lease with a use outlives its Get).
		v.ref, v.leased = ref, r.d.Leases.KeepGet(v.key)
		r.views.add(v)
		if !r.d.Leases.Held(v.key) { // freed or dead between the lease and now
			r.views.revoke(v.key)
		}
	}
	return v, nil
}

// Revoke closes Revoked of every view of k: its lease is gone (the lease
// table's Gone).
func (r *Reader) Revoke(k leases.Key) { r.views.revoke(k) }

// views tracks live views by the lease that keeps their object alive.
type views struct {
	mu sync.Mutex
	m  map[leases.Key]map[*View]struct{}
}

func (t *views) add(v *View) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[leases.Key]map[*View]struct{}{}
	}
	if t.m[v.key] == nil {
		t.m[v.key] = map[*View]struct{}{}
	}
	t.m[v.key][v] = struct{}{}
}

func (t *views) remove(v *View) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.m[v.key], v)
	if len(t.m[v.key]) == 0 {
		delete(t.m, v.key)
	}
}

func (t *views) revoke(k leases.Key) {
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
