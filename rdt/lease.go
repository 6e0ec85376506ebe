package rdt

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
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

type holdKey struct {
	owner peer.ID
	inc   uint64
	obj   fabric.ObjectID
}

type hold struct {
	ref    Ref
	layout objstore.LayoutSum  // of ref.Desc, which the owner confirmed
	actors map[string]struct{} // explicit holders (Hold)
	gets   int                 // Gets in flight
	idle   time.Time           // when the last Get ended with no holder left
}

func (h *hold) unused() bool { return len(h.actors) == 0 && h.gets == 0 }

// getLinger is how long a lease taken only by Gets outlives the last of
// them: long enough for a loop of Gets to reuse it, short enough that an
// owner waiting for its memory (WaitFreed) barely notices.
const getLinger = 100 * time.Millisecond

func (r *Runtime) linger() time.Duration { return min(getLinger, r.cfg.LeaseRenew/2) }

func keyOf(ref Ref) holdKey { return holdKey{ref.Owner, ref.Incarnation, ref.Object} }

func (r *Runtime) holdCount() int {
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	return len(r.holds)
}

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
	k := keyOf(ref)
	layout := objstore.LayoutOf(ref.Desc)
	take := func(h *hold) {
		if actor == "" {
			h.gets++
		} else {
			h.actors[actor] = struct{}{}
		}
	}
	r.holdMu.Lock()
	if h, ok := r.holds[k]; ok {
		if subtle.ConstantTimeCompare(h.ref.Token, ref.Token) != 1 {
			r.holdMu.Unlock()
			return fmt.Errorf("%v: %w: token differs from the held ref's", ref, ErrUnauthorized)
		}
		if h.layout != layout {
			r.holdMu.Unlock()
			return fmt.Errorf("%v: %w", ref, ErrLayoutMismatch)
		}
		take(h)
		r.holdMu.Unlock()
		return nil
	}
	r.holdMu.Unlock()
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
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	if r.holds == nil { // shut down meanwhile; the owner's lease expires
		return ErrClosed
	}
	h, ok := r.holds[k]
	if !ok {
		h = &hold{ref: ref, layout: layout, actors: map[string]struct{}{}}
		r.holds[k] = h
	}
	take(h)
	return nil
}

// keepGetHold adds a use to ref's lease while a Get holds one (a View
// that outlives its Get); unget ends it. It reports whether the lease was
// still there.
func (r *Runtime) keepGetHold(ref Ref) bool {
	r.holdMu.Lock()
	defer r.holdMu.Unlock()
	h, ok := r.holds[keyOf(ref)]
	if ok {
		h.gets++
	}
	return ok
}

// unget ends a Get's use of ref's lease; a lease nobody holds any more is
// released by the life loop after linger.
func (r *Runtime) unget(ref Ref) {
	r.holdMu.Lock()
	h, ok := r.holds[keyOf(ref)]
	if ok && h.gets > 0 {
		h.gets--
		if h.unused() {
			h.idle = r.cfg.Clock.Now()
			select {
			case r.idleKick <- struct{}{}:
			default:
			}
		}
	}
	r.holdMu.Unlock()
}

// releaseIdle releases the leases that only Gets took and that have been
// unused for linger; it reports whether younger idle ones remain.
func (r *Runtime) releaseIdle(ctx context.Context) (more bool) {
	byOwner := map[peer.ID][]fabric.Claim{}
	layouts := map[peer.ID][]objstore.LayoutSum{}
	now := r.cfg.Clock.Now()
	r.holdMu.Lock()
	for k, h := range r.holds {
		if !h.unused() {
			continue
		}
		if now.Sub(h.idle) < r.linger() {
			more = true
			continue
		}
		delete(r.holds, k)
		byOwner[k.owner] = append(byOwner[k.owner], fabric.Claim{Object: k.obj, Incarnation: k.inc, Token: h.ref.Token})
		layouts[k.owner] = append(layouts[k.owner], h.layout)
	}
	r.holdMu.Unlock()
	for owner, cl := range byOwner {
		r.releaseAt(ctx, owner, cl, layouts[owner], "lease release not delivered; it will expire")
	}
	return more
}

// releaseAt tells owner this runtime no longer holds the claims, in
// messages of at most ctlwire.MaxClaims, each bounded by a heartbeat interval. An
// owner that does not answer is logged (why) and left to expire them.
func (r *Runtime) releaseAt(ctx context.Context, owner peer.ID, cl []fabric.Claim, layouts []objstore.LayoutSum, why string) {
	for start := 0; start < len(cl); start += ctlwire.MaxClaims {
		cctx, cancel := context.WithTimeout(ctx, r.cfg.HeartbeatInterval)
		end := min(start+ctlwire.MaxClaims, len(cl))
		_, _, err := r.leaseRemote(cctx, owner, ctlwire.LifeRelease, cl[start:end], layouts[start:end])
		cancel()
		if err != nil {
			r.log.Info(why, "owner", shortID(owner), "leases", len(cl), "err", err)
			return
		}
	}
}

// unhold drops actor's hold on ref and the runtime's lease with it when it
// was the last holder.
func (r *Runtime) unhold(ctx context.Context, actor string, ref Ref) error {
	k := keyOf(ref)
	r.holdMu.Lock()
	h, ok := r.holds[k]
	if !ok {
		r.holdMu.Unlock()
		return nil
	}
	delete(h.actors, actor)
	last := h.unused()
	if last {
		delete(r.holds, k)
	}
	r.holdMu.Unlock()
	if !last {
		return nil
	}
	cl := fabric.Claim{Object: ref.Object, Incarnation: ref.Incarnation, Token: ref.Token}
	_, errs, err := r.leaseRemote(ctx, ref.Owner, ctlwire.LifeRelease, []fabric.Claim{cl}, []objstore.LayoutSum{h.layout})
	if err != nil {
		// The owner will expire the lease; say so rather than fail: the
		// reader is done with the ref either way.
		r.log.Info("lease release not delivered; it will expire", "ref", ref, "err", err)
		return nil
	}
	if errs[0] != nil && !isGone(errs[0]) {
		return errs[0]
	}
	return nil
}

// renewLeases renews every lease this runtime holds, one request per owner,
// and forgets those whose objects are gone. It keeps every owner it holds
// leases on watched (watching: the life loop's own map of peer uses), so
// an owner that goes away while nothing moves from it is still declared
// dead and its holds dropped; without that, a Get that ended before the
// death was noticed would leave its actor's holds renewing in vain.
func (r *Runtime) renewLeases(ctx context.Context, watching map[peer.ID]func()) {
	byOwner := map[peer.ID][]holdKey{}
	claims := map[peer.ID][]fabric.Claim{}
	layouts := map[peer.ID][]objstore.LayoutSum{}
	r.holdMu.Lock()
	for k, h := range r.holds {
		byOwner[k.owner] = append(byOwner[k.owner], k)
		claims[k.owner] = append(claims[k.owner], fabric.Claim{Object: k.obj, Incarnation: k.inc, Token: h.ref.Token})
		layouts[k.owner] = append(layouts[k.owner], h.layout)
	}
	r.holdMu.Unlock()
	for owner := range byOwner {
		if _, ok := watching[owner]; !ok && owner != r.host.ID() {
			watching[owner] = r.peers.Use(owner)
		}
	}
	for owner, unuse := range watching {
		if _, ok := byOwner[owner]; !ok {
			unuse()
			delete(watching, owner)
		}
	}
	// Owners are renewed concurrently (a few at a time) so one that hangs
	// cannot delay the others' renewals past their expiry.
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for owner, keys := range byOwner {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			r.renewOwner(ctx, owner, keys, claims[owner], layouts[owner])
		}()
	}
	wg.Wait()
}

func (r *Runtime) renewOwner(ctx context.Context, owner peer.ID, keys []holdKey, claims []fabric.Claim, layouts []objstore.LayoutSum) {
	for start := 0; start < len(keys); start += ctlwire.MaxClaims {
		end := min(start+ctlwire.MaxClaims, len(keys))
		cctx, cancel := context.WithTimeout(ctx, r.cfg.LeaseRenew)
		_, errs, err := r.leaseRemote(cctx, owner, ctlwire.LifeLease, claims[start:end], layouts[start:end])
		cancel()
		if err != nil {
			r.log.Debug("lease renewal failed", "owner", shortID(owner), "leases", end-start, "err", err)
			continue // death detection, or the next round, decides
		}
		r.holdMu.Lock()
		for i, e := range errs {
			if e != nil && isGone(e) {
				r.log.Info("held ref is gone", "object", keys[start+i].obj, "owner", shortID(owner), "err", e)
				delete(r.holds, keys[start+i])
				r.views.revoke(keys[start+i]) // view.go
			}
		}
		r.holdMu.Unlock()
	}
}

// peerDied is called once per dead incarnation: refs held on it are gone,
// and leases it held on our objects go at once instead of at expiry.
func (r *Runtime) peerDied(id peer.ID, inc uint64, reason string) {
	r.log.Warn("peer died", "peer", shortID(id), "incarnation", fmt.Sprintf("%x", inc), "reason", reason)
	r.lifeMetrics.peerDeaths.WithLabelValues(reason).Inc()
	r.holdMu.Lock()
	for k := range r.holds {
		if k.owner == id && k.inc == inc {
			delete(r.holds, k)
			r.views.revoke(k) // view.go
		}
	}
	r.holdMu.Unlock()
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
			if r.releaseIdle(ctx) {
				idle = clk.After(r.linger())
			}
		case <-renew.Chan():
			r.renewLeases(ctx, watching)
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

// releaseAllHolds sends release for every lease this runtime holds (at
// Shutdown), bounded by ctx; undelivered ones expire on their owners.
func (r *Runtime) releaseAllHolds(ctx context.Context) {
	byOwner := map[peer.ID][]fabric.Claim{}
	layouts := map[peer.ID][]objstore.LayoutSum{}
	r.holdMu.Lock()
	for k, h := range r.holds {
		byOwner[k.owner] = append(byOwner[k.owner], fabric.Claim{Object: k.obj, Incarnation: k.inc, Token: h.ref.Token})
		layouts[k.owner] = append(layouts[k.owner], h.layout)
	}
	r.holds = nil
	r.holdMu.Unlock()
	for owner, cl := range byOwner {
		if owner == r.host.ID() {
			continue
		}
		r.releaseAt(ctx, owner, cl, layouts[owner], "lease release at shutdown not delivered; it will expire")
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
