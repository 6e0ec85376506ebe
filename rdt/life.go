package rdt

import (
	"context"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/life"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
)

// The lifecycle protocol (heartbeats and leases; its transport is package
// life, its codec ctlwire.LifeMsg): what this runtime answers.

// handleLife answers heartbeats and lease requests.
func (r *Runtime) handleLife(s network.Stream) {
	life.Serve(s, controlTimeout, r.faults.Hung.Load(), r.log, func(who peer.ID, m ctlwire.LifeMsg) (ctlwire.LifeMsg, bool) {
		reply := ctlwire.LifeMsg{Incarnation: r.incarnation}
		switch m.Kind {
		case ctlwire.LifePing:
			reply.Kind = ctlwire.LifePong
		case ctlwire.LifeLease, ctlwire.LifeRelease:
			reply.Kind = ctlwire.LifeLeased
			reply.Statuses = r.leaseClaims(who, m.Kind, m.Claims, m.Layouts)
			if m.Kind == ctlwire.LifeLease {
				reply.TTL = r.cfg.LeaseExpiry
			}
		default:
			return reply, false
		}
		return reply, true
	})
}

// leaseClaims applies a lease or release request from who to this
// runtime's objects and returns a status per claim.
func (r *Runtime) leaseClaims(who peer.ID, kind byte, claims []fabric.Claim, layouts []objstore.LayoutSum) []byte {
	expires := r.cfg.Clock.Now().Add(r.cfg.LeaseExpiry)
	if who == r.host.ID() {
		expires = objstore.NoExpiry
	}
	out := r.objects.LeaseClaims(who, kind == ctlwire.LifeRelease, claims, layouts, expires)
	op := "lease"
	if kind == ctlwire.LifeRelease {
		op = "release"
	}
	r.lifeMetrics.LeaseRequests.WithLabelValues(op).Add(float64(len(claims)))
	r.lifeMetrics.LeaseMessages.WithLabelValues(op).Inc()
	return out
}

// call sends one lifecycle request to id and returns its reply.
func (r *Runtime) call(ctx context.Context, id peer.ID, m ctlwire.LifeMsg) (ctlwire.LifeMsg, error) {
	return life.Call(ctx, r.host, r.incarnation, id, m)
}

// leaseRemote sends a lease or release for claims to their owner and turns
// the statuses into errors (nil for granted).
func (r *Runtime) leaseRemote(ctx context.Context, owner peer.ID, kind byte, claims []fabric.Claim, layouts []objstore.LayoutSum) (uint64, []error, error) {
	if owner == r.host.ID() {
		return r.incarnation, ctlwire.LeaseErrs(r.leaseClaims(owner, kind, claims, layouts)), nil
	}
	reply, err := r.call(ctx, owner, ctlwire.LifeMsg{Kind: kind, Claims: claims, Layouts: layouts})
	if err != nil {
		return 0, nil, err
	}
	r.peers.SawAlive(owner, reply.Incarnation)
	return reply.Incarnation, ctlwire.LeaseErrs(reply.Statuses), nil
}
