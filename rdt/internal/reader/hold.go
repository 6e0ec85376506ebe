package reader

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/leases"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
)

// HoldFor makes actor a holder of ref for rdt's Hold: a ref this runtime
// owns needs no lease (the owner's runtime does not lease from itself),
// only the right incarnation.
func (r *Reader) HoldFor(ctx context.Context, actor string, ref Ref) error {
	if r.env.Closed() {
		return errs.Closed
	}
	if self, inc := r.env.Self(); ref.Owner == self {
		if ref.Incarnation != inc {
			return errs.StaleRef
		}
		return nil
	}
	return r.Hold(ctx, actor, ref)
}

// Hold makes actor a holder of ref (or, with actor "", counts a Get in
// flight), registering a lease with the owner when this runtime did not
// hold one yet. Errors say why the object cannot be held: ObjectFreed,
// StaleRef, Unauthorized, ObjectNotFound, PeerUnreachable or OwnerDied.
//
// The lease also confirms the ref's layout with the owner (LayoutMismatch
// if it is not the published one), so a Get allocates only for a layout its
// owner vouched for. A ref matching a hold already taken must carry the same
// token and layout as the ref the owner confirmed then.
func (r *Reader) Hold(ctx context.Context, actor string, ref Ref) error {
	layout := objstore.LayoutOf(ref.Desc)
	if held, err := r.d.Leases.Join(actor, ref, layout); held {
		if err != nil {
			return fmt.Errorf("%v: %w", ref, err)
		}
		return nil
	}
	if r.d.Peers.IsDead(ref.Owner, ref.Incarnation) {
		return r.counted(r.DeadErr(ref, errors.New("declared dead earlier")))
	}
	if !r.own(ref) {
		r.env.Learn(ref)
	}
	inc, es, err := r.env.Lease(ctx, ref.Owner, []fabric.Claim{claim(ref)}, []ctlwire.Layout{layout})
	if err != nil {
		if errors.Is(err, errs.PeerUnreachable) && r.d.Peers.IsDead(ref.Owner, ref.Incarnation) {
			return r.counted(r.ownerDiedErr(ref, err))
		}
		return err
	}
	if inc != ref.Incarnation {
		return fmt.Errorf("%w: %v: owner restarted (incarnation %x, ref names %x)", errs.StaleRef, ref, inc, ref.Incarnation)
	}
	if es[0] != nil {
		return fmt.Errorf("%v: %w", ref, es[0])
	}
	return r.d.Leases.Add(actor, ref, layout)
}

// unget ends a Get's use of ref's lease; a lease nobody holds any more is
// released by the runtime after its linger.
func (r *Reader) unget(ref Ref) { r.d.Leases.Unget(leases.KeyOf(ref)) }

// Guard prepares a read of ref: for a ref owned by another runtime it
// takes a Get's hold on it for the read's duration (a lease with the
// owner, which also checks the ref and its layout: freed, stale or forged
// refs fail here, before the reader allocates), watches the owner, and
// returns a context cancelled with the verdict if the owner incarnation
// is declared dead meanwhile; end releases both. A ref this runtime owns
// is checked against its own object table.
func (r *Reader) Guard(ctx context.Context, ref Ref) (_ context.Context, end func(), _ error) {
	if r.own(ref) {
		if err := r.env.Confirm(ref); err != nil {
			return nil, nil, fmt.Errorf("%v: %w", ref, err)
		}
		return ctx, func() {}, nil
	}
	// The watch starts before the lease request: a hung owner never
	// answers that request either. Except when this runtime knows another
	// incarnation of the owner: the ref may name a newer one it has not met
	// yet (DeathOf would take it for the older), so the lease's answer says
	// which incarnation runs first.
	const what = "a Get waited on it"
	stop := func() {}
	_, other := r.d.Peers.Replaced(ref.Owner, ref.Incarnation)
	hctx := ctx
	if !other {
		hctx, stop = r.watch(ctx, ref, what)
	}
	if err := r.Hold(hctx, "", ref); err != nil {
		err = r.Why(hctx, ref, err)
		if context.Cause(hctx) == nil && r.frozenOwner(hctx, ref, err) {
			err = r.counted(r.frozenErr(ref, err))
		}
		stop()
		return nil, nil, err
	}
	if other {
		hctx, stop = r.watch(ctx, ref, what)
	}
	return hctx, func() {
		stop()
		r.unget(ref)
	}, nil
}

// HoldBatch makes actor a holder of every ref, with one lease request per
// owner (per ctlwire.MaxClaims refs) for those this runtime does not hold
// yet. It returns each ref's error.
func (r *Reader) HoldBatch(ctx context.Context, actor string, refs []Ref) []error {
	out := make([]error, len(refs))
	self, selfInc := r.env.Self()
	type owner struct {
		id  peer.ID
		inc uint64
	}
	groups := map[owner][]int{}
	for i, ref := range refs {
		if err := ref.Desc.Validate(); err != nil {
			out[i] = fmt.Errorf("%w: %v", errs.MalformedRef, err)
			continue
		}
		if ref.Owner == self {
			if ref.Incarnation != selfInc {
				out[i] = errs.StaleRef
			}
			continue
		}
		if r.d.Leases.Held(leases.KeyOf(ref)) {
			continue // held already: the Get's own hold checks and joins it
		}
		k := owner{ref.Owner, ref.Incarnation}
		groups[k] = append(groups[k], i)
	}
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.holdGroup(ctx, actor, refs, idx, out)
		}()
	}
	wg.Wait()
	return out
}

// holdGroup leases refs[idx...], all of one owner incarnation.
func (r *Reader) holdGroup(ctx context.Context, actor string, refs []Ref, idx []int, out []error) {
	first := refs[idx[0]]
	if r.d.Peers.IsDead(first.Owner, first.Incarnation) {
		for _, i := range idx {
			out[i] = r.counted(r.DeadErr(refs[i], errors.New("declared dead earlier")))
		}
		return
	}
	r.env.Learn(first)
	// Watched as a Get's lease request is (Guard); a frozen owner never
	// reached says OwnerDied, not the dial's PeerUnreachable at its own
	// deadline (frozenOwner).
	if _, other := r.d.Peers.Replaced(first.Owner, first.Incarnation); !other {
		var stop func()
		ctx, stop = r.watch(ctx, first, "a batch's lease request waited on it")
		defer stop()
	}
	for start := 0; start < len(idx); start += ctlwire.MaxClaims {
		part := idx[start:min(start+ctlwire.MaxClaims, len(idx))]
		claims := make([]fabric.Claim, len(part))
		layouts := make([]ctlwire.Layout, len(part))
		for k, i := range part {
			claims[k], layouts[k] = claim(refs[i]), objstore.LayoutOf(refs[i].Desc)
		}
		inc, es, err := r.env.Lease(ctx, first.Owner, claims, layouts)
		cause := context.Cause(ctx)
		frozen := cause == nil && r.frozenOwner(ctx, first, err)
		for k, i := range part {
			ref := refs[i]
			switch {
			case err != nil && cause != nil && (errors.Is(cause, errs.OwnerDied) || errors.Is(cause, errs.PeerUnreachable) || errors.Is(cause, errs.StaleRef)):
				out[i] = fmt.Errorf("%w (lease request: %v)", cause, err)
			case frozen:
				out[i] = r.counted(r.frozenErr(ref, err))
			case err != nil && errors.Is(err, errs.PeerUnreachable) && r.d.Peers.IsDead(ref.Owner, ref.Incarnation):
				out[i] = r.counted(r.ownerDiedErr(ref, err))
			case err != nil:
				out[i] = err
			case inc != ref.Incarnation:
				out[i] = fmt.Errorf("%w: %v: owner restarted (incarnation %x, ref names %x)", errs.StaleRef, ref, inc, ref.Incarnation)
			case es[k] != nil:
				out[i] = fmt.Errorf("%v: %w", ref, es[k])
			default:
				out[i] = r.d.Leases.Add(actor, ref, objstore.LayoutOf(ref.Desc))
			}
		}
	}
}
