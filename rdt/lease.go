package rdt

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/leases"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// Reference counting with leases. A reader runtime holds one lease per
// object on its owner while any of its actors holds the ref (Hold takes a
// hold, Release drops it) or a Get of it is in flight. A Get's lease
// lingers for getLinger after the Get returns, so back-to-back Gets of one
// ref cost no extra round trips, and is then released: a reader done with
// a Get has nothing more to release than the tensor it got. It renews its leases every LeaseRenew; the owner
// forgets a lease not renewed within LeaseExpiry, so a dead reader cannot
// pin memory forever. An object whose owner called Release is freed when its
// last lease goes; Free frees it at once and revokes every ref.

// getLinger is how long a lease taken only by Gets outlives the last of
// them: long enough for a loop of Gets to reuse it, short enough that an
// owner waiting for its memory (WaitFreed) barely notices.
const getLinger = 100 * time.Millisecond

func (r *Runtime) linger() time.Duration { return min(getLinger, r.cfg.LeaseRenew/2) }

// holdKey names a lease this runtime holds (leases.Key).
type holdKey = leases.Key

func keyOf(ref Ref) holdKey { return leases.KeyOf(refwire.Ref(ref)) }

func (r *Runtime) holdCount() int { return r.leases.Len() }

// hold makes actor a holder of ref (or, with actor "", counts a Get in
// flight), registering a lease with the owner when this runtime did not
// hold one yet. Errors say why the object cannot be held: ErrObjectFreed, ErrStaleRef, ErrUnauthorized, ErrObjectNotFound,
// ErrPeerUnreachable or ErrOwnerDied.
//
// The lease also confirms the ref's layout with the owner (ErrLayoutMismatch
// if it is not the published one), so a Get allocates only for a layout its
// owner vouched for. A ref matching a hold already taken must carry the same
// token and layout as the ref the owner confirmed then.
func (r *Runtime) hold(ctx context.Context, actor string, ref Ref) error {
	layout := objstore.LayoutOf(ref.Desc)
	if held, err := r.leases.Join(actor, refwire.Ref(ref), layout); held {
		if err != nil {
			return fmt.Errorf("%v: %w", ref, err)
		}
		return nil
	}
	if r.peers.IsDead(ref.Owner, ref.Incarnation) {
		return r.deadErr(ref, errors.New("declared dead earlier"))
	}
	if ref.Owner != r.host.ID() {
		r.learnAddrs(ref)
	}
	cl := fabric.Claim{Object: ref.Object, Incarnation: ref.Incarnation, Token: ref.Token}
	inc, errs, err := r.leaseRemote(ctx, ref.Owner, ctlwire.LifeLease, []fabric.Claim{cl}, []objstore.LayoutSum{layout})
	if err != nil {
		if errors.Is(err, ErrPeerUnreachable) && r.peers.IsDead(ref.Owner, ref.Incarnation) {
			return r.ownerDiedErr(ref, err)
		}
		return err
	}
	if inc != ref.Incarnation {
		return fmt.Errorf("%w: %v: owner restarted (incarnation %x, ref names %x)", ErrStaleRef, ref, inc, ref.Incarnation)
	}
	if errs[0] != nil {
		return fmt.Errorf("%v: %w", ref, errs[0])
	}
	return r.leases.Add(actor, refwire.Ref(ref), layout)
}

// keepGetHold adds a use to ref's lease while a Get holds one (a View
// that outlives its Get); unget ends it. It reports whether the lease was
// still there.
func (r *Runtime) keepGetHold(ref Ref) bool { return r.leases.KeepGet(keyOf(ref)) }

// unget ends a Get's use of ref's lease; a lease nobody holds any more is
// released by the life loop after linger.
func (r *Runtime) unget(ref Ref) { r.leases.Unget(keyOf(ref)) }

// unhold drops actor's hold on ref and the runtime's lease with it when it
// was the last holder.
func (r *Runtime) unhold(ctx context.Context, actor string, ref Ref) error {
	return r.leases.Unhold(ctx, actor, refwire.Ref(ref))
}

// leaser is the runtime's lifecycle protocol as the lease table sends on it.
type leaser struct{ r *Runtime }

func (l leaser) Lease(ctx context.Context, owner peer.ID, kind byte, claims []fabric.Claim, layouts []ctlwire.Layout) (uint64, []error, error) {
	return l.r.leaseRemote(ctx, owner, kind, claims, layouts)
}

// newLeases is this runtime's lease table.
func (r *Runtime) newLeases() *leases.Table {
	return leases.New(leases.Config{Leaser: leaser{r}, Self: r.host.ID(), Clock: r.cfg.Clock, Log: r.log,
		Linger: r.linger(), RenewWait: r.cfg.LeaseRenew, ReleaseWait: r.cfg.HeartbeatInterval,
		Watch: r.peers.Use, Gone: r.views.revoke, Idle: func() {
			select {
			case r.idleKick <- struct{}{}:
			default:
			}
		}})
}

// peerDied is called once per dead incarnation: refs held on it are gone,
// and leases it held on our objects go at once instead of at expiry.
func (r *Runtime) peerDied(id peer.ID, inc uint64, reason string) {
	r.log.Warn("peer died", "peer", shortID(id), "incarnation", fmt.Sprintf("%x", inc), "reason", reason)
	r.lifeMetrics.peerDeaths.WithLabelValues(reason).Inc()
	r.leases.Drop(id, inc)
	if r.objects.DropPeer(id) > 0 {
		r.kickReaper()
	}
}

func (r *Runtime) kickReaper() {
	select {
	case r.reap <- struct{}{}:
	default:
	}
}

// lifeLoop renews this runtime's leases and expires others' on its objects.
func (r *Runtime) lifeLoop(ctx context.Context) {
	defer r.loops.Done()
	clk := r.cfg.Clock
	renew := clk.NewTicker(r.cfg.LeaseRenew)
	defer renew.Stop()
	// Expiry is checked a few times per expiry period so a lease outlives
	// its deadline by at most a quarter of it.
	expire := clk.NewTicker(r.cfg.LeaseExpiry / 4)
	defer expire.Stop()
	var idle <-chan time.Time        // armed while Get-only leases linger
	watching := map[peer.ID]func(){} // owners of held leases (renewLeases)
	defer func() {
		for _, unuse := range watching {
			unuse()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-r.idleKick:
			if idle == nil {
				idle = clk.After(r.linger())
			}
		case <-idle:
			idle = nil
			if r.leases.ReleaseIdle(ctx) {
				idle = clk.After(r.linger())
			}
		case <-renew.Chan():
			r.leases.Renew(ctx, watching)
		case <-expire.Chan():
			r.expireLeases()
		case <-r.reap:
			r.expireLeases()
		}
	}
}

func (r *Runtime) expireLeases() {
	if n := r.objects.Expire(r.cfg.Clock.Now()); n > 0 {
		r.lifeMetrics.leasesExpired.Add(float64(n))
		r.log.Info("reader leases expired", "count", n)
	}
}

// deadErr says why a ref's owner incarnation is gone: replaced by a new
// one (ErrStaleRef) or dead (ErrOwnerDied).
func (r *Runtime) deadErr(ref Ref, cause error) error {
	if now, ok := r.peers.Replaced(ref.Owner, ref.Incarnation); ok {
		return fmt.Errorf("%w: %v: owner restarted (incarnation %x)", ErrStaleRef, ref, now)
	}
	return r.ownerDiedErr(ref, cause)
}

func (r *Runtime) ownerDiedErr(ref Ref, cause error) error {
	r.lifeMetrics.ownerDied.Inc()
	return fmt.Errorf("%w: %s (incarnation %x) holding %v: %w", ErrOwnerDied, shortID(ref.Owner), ref.Incarnation, ref.Object, cause)
}
