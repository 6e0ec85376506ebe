package rdt

import (
	"context"
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/rdt/internal/peers"
)

// The probe and why it can tell a frozen owner from an unreachable one:
// rdt/internal/peers (probe.go).

// deathVerdict is the error of a Get or lease request that waited on the
// owner of ref (what says which) when the heartbeats declared it dead: the
// owner died (or restarted: a stale ref), or, when it never answered this
// runtime, died if the probe finds it frozen and is unreachable if not
// (a live process that will not talk to us, or nothing listening).
func (r *Runtime) deathVerdict(ctx context.Context, ref Ref, what string) error {
	if r.peers.NeverAnswered(ref.Owner, ref.Incarnation) {
		o := peers.Probe(ctx, ref.Addrs, peers.ProbeWait)
		r.log.Info("owner never answered this runtime: probed its control listener", "owner", shortID(ref.Owner), "outcome", o.String(), "while", what)
		if o == peers.Silent {
			return r.deadErr(ref, fmt.Errorf("never answered this runtime while %s; its control listener accepts connections that no process serves (frozen or hung)", what))
		}
		return fmt.Errorf("%w: the owner of %v never answered this runtime (its heartbeats missed from the start)", ErrPeerUnreachable, ref)
	}
	return r.deadErr(ref, fmt.Errorf("declared dead while %s", what))
}

// frozenOwner reports whether err, the failure of this runtime's first
// contact with ref's owner (a lease request whose dial gave up:
// ErrPeerUnreachable), came from a frozen owner: one that never answered
// here, whose listener the probe finds silent. The dial's own deadline
// (libp2p's, 5 s on private networks) can come before the heartbeats'
// verdict, so both paths ask.
func (r *Runtime) frozenOwner(ctx context.Context, ref Ref, err error) bool {
	if err == nil || !errors.Is(err, ErrPeerUnreachable) || errors.Is(err, ErrOwnerDied) {
		return false
	}
	if !r.peers.NeverAnswered(ref.Owner, ref.Incarnation) {
		return false
	}
	o := peers.Probe(ctx, ref.Addrs, peers.ProbeWait)
	r.log.Info("first contact with an owner failed: probed its control listener", "owner", shortID(ref.Owner), "outcome", o.String(), "err", err)
	return o == peers.Silent
}

// frozenErr is the error of a read from a frozen owner (frozenOwner).
func (r *Runtime) frozenErr(ref Ref, err error) error {
	return r.deadErr(ref, fmt.Errorf("never answered this runtime (%v); its control listener accepts connections that no process serves (frozen or hung)", err))
}
