package reader

import (
	"context"
	"errors"
	"fmt"
	"sync"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/peers"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// watch keeps ref's owner watched and returns a context cancelled with the
// verdict on its death (deathVerdict) when the heartbeats declare
// incarnation ref.Incarnation dead while the read it guards runs (what
// says which read, for the error). stop ends the watch and waits for its
// goroutine. Every read path watches its owner with it: a single Get's
// lease and transfer (Guard), a batch's lease request (holdGroup) and a
// batch's transfers (fetchOwner). A hung owner (its connection open,
// nothing answering) answers neither a lease request nor a read, and only
// the heartbeats' verdict ends those in time.
func (r *Reader) watch(ctx context.Context, ref Ref, what string) (_ context.Context, stop func()) {
	unuse := r.d.Peers.Use(ref.Owner)
	ctx, cancel := context.WithCancelCause(ctx)
	death := r.d.Peers.DeathOf(ref.Owner, ref.Incarnation)
	done := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-death:
			cancel(r.deathVerdict(ctx, ref, what))
		case <-done:
		case <-ctx.Done():
		}
	}()
	return ctx, func() {
		close(done)
		cancel(nil)
		wg.Wait()
		unuse()
	}
}

// deathVerdict is the error of a read or lease request that waited on the
// owner of ref (what says which) when the heartbeats declared it dead: the
// owner died (or restarted: a stale ref), or, when it never answered this
// runtime, died if the probe finds it frozen and is unreachable if not
// (a live process that will not talk to us, or nothing listening).
func (r *Reader) deathVerdict(ctx context.Context, ref Ref, what string) error {
	if r.d.Peers.NeverAnswered(ref.Owner, ref.Incarnation) {
		o := r.env.Probe(ctx, ref.Addrs)
		r.d.Log.Info("owner never answered this runtime: probed its control listener", "owner", refwire.ShortID(ref.Owner), "outcome", o.String(), "while", what)
		if o == peers.Silent {
			return r.DeadErr(ref, fmt.Errorf("never answered this runtime while %s; its control listener accepts connections that no process serves (frozen or hung)", what))
		}
		return fmt.Errorf("%w: the owner of %v never answered this runtime (its heartbeats missed from the start)", errs.PeerUnreachable, ref)
	}
	return r.DeadErr(ref, fmt.Errorf("declared dead while %s", what))
}

// frozenOwner reports whether err, the failure of this runtime's first
// contact with ref's owner (a lease request whose dial gave up:
// errs.PeerUnreachable), came from a frozen owner: one that never answered
// here, whose listener the probe finds silent. The dial's own deadline
// (libp2p's, 5 s on private networks) can come before the heartbeats'
// verdict, so both paths ask.
func (r *Reader) frozenOwner(ctx context.Context, ref Ref, err error) bool {
	if err == nil || !errors.Is(err, errs.PeerUnreachable) || errors.Is(err, errs.OwnerDied) {
		return false
	}
	if !r.d.Peers.NeverAnswered(ref.Owner, ref.Incarnation) {
		return false
	}
	o := r.env.Probe(ctx, ref.Addrs)
	r.d.Log.Info("first contact with an owner failed: probed its control listener", "owner", refwire.ShortID(ref.Owner), "outcome", o.String(), "err", err)
	return o == peers.Silent
}

// frozenErr is the error of a read from a frozen owner (frozenOwner).
func (r *Reader) frozenErr(ref Ref, err error) error {
	return r.DeadErr(ref, fmt.Errorf("never answered this runtime (%v); its control listener accepts connections that no process serves (frozen or hung)", err))
}

// DeadErr says why a ref's owner incarnation is gone: replaced by a new
// one (errs.StaleRef) or dead (errs.OwnerDied).
func (r *Reader) DeadErr(ref Ref, cause error) error {
	if now, ok := r.d.Peers.Replaced(ref.Owner, ref.Incarnation); ok {
		return fmt.Errorf("%w: %v: owner restarted (incarnation %x)", errs.StaleRef, ref, now)
	}
	return r.ownerDiedErr(ref, cause)
}

// ownerDiedErr is the error of ref's owner's death; the call that returns it
// to a caller counts it (counted), once.
func (r *Reader) ownerDiedErr(ref Ref, cause error) error {
	return fmt.Errorf("%w: %s (incarnation %x) holding %v: %w", errs.OwnerDied, refwire.ShortID(ref.Owner), ref.Incarnation, ref.Object, cause)
}

// Why turns a failed read's error into the condition behind it: the
// owner's death (signalled, or confirmed now because the data path broke
// and the owner no longer answers), Shutdown, or the error itself.
func (r *Reader) Why(ctx context.Context, ref Ref, err error) error {
	if cause := context.Cause(ctx); cause != nil && (errors.Is(cause, errs.OwnerDied) || errors.Is(cause, errs.PeerUnreachable) || errors.Is(cause, errs.StaleRef) || errors.Is(cause, errs.Closed)) {
		if errors.Is(err, cause) {
			return r.counted(err)
		}
		return r.counted(fmt.Errorf("%w; transfer: %w", cause, err))
	}
	if r.own(ref) || fabric.Terminal(err) || errors.Is(err, errs.OwnerDied) {
		return r.counted(err)
	}
	if errors.Is(err, fabric.ErrPeerClosed) || errors.Is(err, fabric.ErrStalled) || errors.Is(err, errs.PeerUnreachable) {
		// Is the owner gone, or only the path? One ping, at most a
		// heartbeat interval, tells.
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.d.PingWait)
		inc, perr := r.env.Ping(pctx, ref.Owner)
		cancel()
		switch {
		case perr != nil && !r.env.Closed() && r.d.Peers.SeenAlive(ref.Owner, ref.Incarnation):
			r.d.Peers.DeclareDead(ref.Owner, "connection lost")
			return r.counted(r.ownerDiedErr(ref, err))
		case perr != nil && !errors.Is(err, errs.PeerUnreachable):
			// Never reached on the control channel: not known to have
			// lived, so not known to have died.
			return fmt.Errorf("%w; transfer: %w", perr, err)
		case perr == nil && inc != ref.Incarnation:
			r.d.Peers.SawAlive(ref.Owner, inc)
			return fmt.Errorf("%w: owner restarted; transfer: %w", errs.StaleRef, err)
		}
	}
	return err
}

// counted counts err when it says the owner died, once however many
// layers of a read pass it on (the mark is an error wrapper that changes
// neither its text nor what it matches).
func (r *Reader) counted(err error) error {
	var c countedErr
	if !errors.Is(err, errs.OwnerDied) || errors.As(err, &c) {
		return err
	}
	r.d.OwnerDied.Inc()
	return countedErr{err}
}

// countedErr marks an owner's death already counted.
type countedErr struct{ error }

func (e countedErr) Unwrap() error { return e.error }
