// Package leases is a reader runtime's table of the leases it holds on
// other runtimes' objects (reference counting with leases). A runtime holds
// one lease per object on its owner while any of its actors holds the ref
// or a Get of it is in flight; a Get's lease lingers briefly after the Get
// returns, so back-to-back Gets of one ref cost no extra round trips. The
// table keeps its leases (Keep): it renews them every renewal period (the owner forgets a lease
// not renewed in time, so a dead reader cannot pin memory forever), drops
// those whose objects are gone, and releases them when done. The owner's
// side is objstore.Table; the messages go through Leaser (rdt's lifecycle
// protocol).
package leases

import (
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// Key names a held lease: the owner's incarnation and the object.
type Key struct {
	Owner peer.ID
	Inc   uint64
	Obj   fabric.ObjectID
}

// KeyOf is ref's key.
func KeyOf(ref refwire.Ref) Key { return Key{ref.Owner, ref.Incarnation, ref.Object} }

// Leaser sends a lease or a release (ctlwire.LifeLease, LifeRelease) for
// claims, with the layouts the reader expects, to their owner, and returns
// the incarnation that answered and each claim's condition.
type Leaser interface {
	Lease(ctx context.Context, owner peer.ID, kind byte, claims []fabric.Claim, layouts []ctlwire.Layout) (uint64, []error, error)
}

// Config is what a Table is built from.
type Config struct {
	Leaser Leaser
	Self   peer.ID // this runtime: its own objects' leases are not renewed over the network
	Clock  clockwork.Clock
	Log    *slog.Logger
	// Linger is how long a lease only Gets took outlives the last of them;
	// Keep renews every RenewWait, which also bounds each renewal;
	// ReleaseWait bounds each release message.
	Linger, RenewWait, ReleaseWait time.Duration
	// Watch keeps an owner watched (its failure detected) until the
	// returned func is called.
	Watch func(owner peer.ID) func()
	// Gone is told of each lease dropped because its object or owner is
	// gone (views of it are revoked).
	Gone func(Key)
}

type hold struct {
	ref    refwire.Ref
	layout ctlwire.Layout      // of ref.Desc, which the owner confirmed
	actors map[string]struct{} // explicit holders (Hold)
	gets   int                 // Gets in flight
	idle   time.Time           // when the last Get ended with no holder left
}

func (h *hold) unused() bool { return len(h.actors) == 0 && h.gets == 0 }

// Table is the leases a runtime holds as a reader.
type Table struct {
	c    Config
	mu   sync.Mutex
	m    map[Key]*hold // nil once ReleaseAll ran
	idle chan struct{} // a Get-only lease went unused: ReleaseIdle is due after Linger
}

// New returns an empty table.
func New(c Config) *Table { return &Table{c: c, m: map[Key]*hold{}, idle: make(chan struct{}, 1)} }

// Keep keeps the table's leases until ctx is done: it renews them every
// RenewWait (Renew) and releases those only Gets took once they lingered
// (ReleaseIdle). The owners of held leases stay watched while it runs.
func (t *Table) Keep(ctx context.Context) {
	clk := t.c.Clock
	renew := clk.NewTicker(t.c.RenewWait)
	defer renew.Stop()
	var idle <-chan time.Time        // armed while Get-only leases linger
	watching := map[peer.ID]func(){} // owners of held leases (Renew)
	defer func() {
		for _, unuse := range watching {
			unuse()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.idle:
			if idle == nil {
				idle = clk.After(t.c.Linger)
			}
		case <-idle:
			idle = nil
			if t.ReleaseIdle(ctx) {
				idle = clk.After(t.c.Linger)
			}
		case <-renew.Chan():
			t.Renew(ctx, watching)
		}
	}
}

func take(h *hold, actor string) {
	if actor == "" {
		h.gets++
	} else {
		h.actors[actor] = struct{}{}
	}
}

// Join makes actor (or, with actor "", a Get in flight) a holder of ref
// when this runtime holds its lease already; held says whether it does. A
// ref matching a held lease must carry the token and layout the owner
// confirmed.
func (t *Table) Join(actor string, ref refwire.Ref, layout ctlwire.Layout) (held bool, err error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.m[KeyOf(ref)]
	if !ok {
		return false, nil
	}
	if subtle.ConstantTimeCompare(h.ref.Token, ref.Token) != 1 {
		return true, fmt.Errorf("%w: token differs from the held ref's", errs.Unauthorized)
	}
	if h.layout != layout {
		return true, errs.LayoutMismatch
	}
	take(h, actor)
	return true, nil
}

// Add records the lease the owner granted on ref and makes actor a holder
// (as Join); after ReleaseAll it is errs.Closed (the owner's lease
// expires).
func (t *Table) Add(actor string, ref refwire.Ref, layout ctlwire.Layout) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		return errs.Closed
	}
	k := KeyOf(ref)
	h, ok := t.m[k]
	if !ok {
		h = &hold{ref: ref, layout: layout, actors: map[string]struct{}{}}
		t.m[k] = h
	}
	take(h, actor)
	return nil
}

// Held says whether the lease of k is held.
func (t *Table) Held(k Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	_, ok := t.m[k]
	return ok
}

// Len is the number of leases held.
func (t *Table) Len() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.m)
}

// KeepGet adds a use to k's lease while a Get holds one (a View that
// outlives its Get); Unget ends it. It reports whether the lease was still
// there.
func (t *Table) KeepGet(k Key) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	h, ok := t.m[k]
	if ok {
		h.gets++
	}
	return ok
}

// Unget ends a Get's use of k's lease; a lease nobody holds any more is
// released by ReleaseIdle after Linger (Keep).
func (t *Table) Unget(k Key) {
	t.mu.Lock()
	h, ok := t.m[k]
	idle := false
	if ok && h.gets > 0 {
		h.gets--
		if h.unused() {
			h.idle = t.c.Clock.Now()
			idle = true
		}
	}
	t.mu.Unlock()
	if idle {
		select {
		case t.idle <- struct{}{}:
		default:
		}
	}
}

// ReleaseIdle releases the leases that only Gets took and that have been
// unused for Linger; it reports whether younger idle ones remain.
func (t *Table) ReleaseIdle(ctx context.Context) (more bool) {
	byOwner := map[peer.ID][]fabric.Claim{}
	layouts := map[peer.ID][]ctlwire.Layout{}
	now := t.c.Clock.Now()
	t.mu.Lock()
	for k, h := range t.m {
		if !h.unused() {
			continue
		}
		if now.Sub(h.idle) < t.c.Linger {
			more = true
			continue
		}
		delete(t.m, k)
		byOwner[k.Owner] = append(byOwner[k.Owner], fabric.Claim{Object: k.Obj, Incarnation: k.Inc, Token: h.ref.Token})
		layouts[k.Owner] = append(layouts[k.Owner], h.layout)
	}
	t.mu.Unlock()
	for owner, cl := range byOwner {
		t.releaseAt(ctx, owner, cl, layouts[owner], "lease release not delivered; it will expire")
	}
	return more
}

// releaseAt tells owner this runtime no longer holds the claims, in
// messages of at most ctlwire.MaxClaims, each bounded by ReleaseWait. An
// owner that does not answer is logged (why) and left to expire them.
func (t *Table) releaseAt(ctx context.Context, owner peer.ID, cl []fabric.Claim, layouts []ctlwire.Layout, why string) {
	for start := 0; start < len(cl); start += ctlwire.MaxClaims {
		cctx, cancel := context.WithTimeout(ctx, t.c.ReleaseWait)
		end := min(start+ctlwire.MaxClaims, len(cl))
		_, _, err := t.c.Leaser.Lease(cctx, owner, ctlwire.LifeRelease, cl[start:end], layouts[start:end])
		cancel()
		if err != nil {
			t.c.Log.Info(why, "owner", refwire.ShortID(owner), "leases", len(cl), "err", err)
			return
		}
	}
}

// Unhold drops actor's hold on ref and the runtime's lease with it when it
// was the last holder.
func (t *Table) Unhold(ctx context.Context, actor string, ref refwire.Ref) error {
	k := KeyOf(ref)
	t.mu.Lock()
	h, ok := t.m[k]
	if !ok {
		t.mu.Unlock()
		return nil
	}
	delete(h.actors, actor)
	last := h.unused()
	if last {
		delete(t.m, k)
	}
	t.mu.Unlock()
	if !last {
		return nil
	}
	cl := fabric.Claim{Object: ref.Object, Incarnation: ref.Incarnation, Token: ref.Token}
	_, es, err := t.c.Leaser.Lease(ctx, ref.Owner, ctlwire.LifeRelease, []fabric.Claim{cl}, []ctlwire.Layout{h.layout})
	if err != nil {
		// The owner will expire the lease; say so rather than fail: the
		// reader is done with the ref either way.
		t.c.Log.Info("lease release not delivered; it will expire", "object", ref.Object, "owner", refwire.ShortID(ref.Owner), "err", err)
		return nil
	}
	if es[0] != nil && !IsGone(es[0]) {
		return es[0]
	}
	return nil
}

// Renew renews every lease held, one request per owner, and forgets those
// whose objects are gone. It keeps every owner it holds leases on watched
// (watching: the caller's own map of owner watches, kept between calls),
// so an owner that goes away while nothing moves from it is still declared
// dead and its leases dropped; without that, a Get that ended before the
// death was noticed would leave its actor's holds renewing in vain.
func (t *Table) Renew(ctx context.Context, watching map[peer.ID]func()) {
	byOwner := map[peer.ID][]Key{}
	claims := map[peer.ID][]fabric.Claim{}
	layouts := map[peer.ID][]ctlwire.Layout{}
	t.mu.Lock()
	for k, h := range t.m {
		byOwner[k.Owner] = append(byOwner[k.Owner], k)
		claims[k.Owner] = append(claims[k.Owner], fabric.Claim{Object: k.Obj, Incarnation: k.Inc, Token: h.ref.Token})
		layouts[k.Owner] = append(layouts[k.Owner], h.layout)
	}
	t.mu.Unlock()
	for owner := range byOwner {
		if _, ok := watching[owner]; !ok && owner != t.c.Self {
			watching[owner] = t.c.Watch(owner)
		}
	}
	for owner, unwatch := range watching {
		if _, ok := byOwner[owner]; !ok {
			unwatch()
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
			t.renewOwner(ctx, owner, keys, claims[owner], layouts[owner])
		}()
	}
	wg.Wait()
}

func (t *Table) renewOwner(ctx context.Context, owner peer.ID, keys []Key, claims []fabric.Claim, layouts []ctlwire.Layout) {
	for start := 0; start < len(keys); start += ctlwire.MaxClaims {
		end := min(start+ctlwire.MaxClaims, len(keys))
		cctx, cancel := context.WithTimeout(ctx, t.c.RenewWait)
		_, es, err := t.c.Leaser.Lease(cctx, owner, ctlwire.LifeLease, claims[start:end], layouts[start:end])
		cancel()
		if err != nil {
			t.c.Log.Debug("lease renewal failed", "owner", refwire.ShortID(owner), "leases", end-start, "err", err)
			continue // death detection, or the next round, decides
		}
		t.mu.Lock()
		for i, e := range es {
			if e != nil && IsGone(e) {
				t.c.Log.Info("held ref is gone", "object", keys[start+i].Obj, "owner", refwire.ShortID(owner), "err", e)
				delete(t.m, keys[start+i])
				t.c.Gone(keys[start+i])
			}
		}
		t.mu.Unlock()
	}
}

// Drop forgets the leases held on incarnation inc of id (declared dead).
func (t *Table) Drop(id peer.ID, inc uint64) {
	t.mu.Lock()
	defer t.mu.Unlock()
	for k := range t.m {
		if k.Owner == id && k.Inc == inc {
			delete(t.m, k)
			t.c.Gone(k)
		}
	}
}

// ReleaseAll sends release for every lease held (at Shutdown), bounded by
// ctx; undelivered ones expire on their owners. The table takes no lease
// after it.
func (t *Table) ReleaseAll(ctx context.Context) {
	byOwner := map[peer.ID][]fabric.Claim{}
	layouts := map[peer.ID][]ctlwire.Layout{}
	t.mu.Lock()
	for k, h := range t.m {
		byOwner[k.Owner] = append(byOwner[k.Owner], fabric.Claim{Object: k.Obj, Incarnation: k.Inc, Token: h.ref.Token})
		layouts[k.Owner] = append(layouts[k.Owner], h.layout)
	}
	t.m = nil
	t.mu.Unlock()
	for owner, cl := range byOwner {
		if owner == t.c.Self {
			continue
		}
		t.releaseAt(ctx, owner, cl, layouts[owner], "lease release at shutdown not delivered; it will expire")
	}
}

// IsGone reports whether a lease error means the object will never be
// readable again.
func IsGone(err error) bool {
	return errors.Is(err, errs.ObjectFreed) || errors.Is(err, errs.ObjectNotFound) || errors.Is(err, errs.StaleRef) || errors.Is(err, errs.Unauthorized) ||
		errors.Is(err, errs.OwnerClosed)
}
