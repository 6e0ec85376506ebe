package rdt

import (
	"context"
	"fmt"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/leases"
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

func (r *Runtime) holdCount() int { return r.leases.Len() }

// leaser is the runtime's lifecycle protocol as the lease table sends on it.
type leaser struct{ r *Runtime }

func (l leaser) Lease(ctx context.Context, owner peer.ID, kind byte, claims []fabric.Claim, layouts []ctlwire.Layout) (uint64, []error, error) {
	return l.r.leaseRemote(ctx, owner, kind, claims, layouts)
}

// newLeases is this runtime's lease table.
func (r *Runtime) newLeases() *leases.Table {
	return leases.New(leases.Config{Leaser: leaser{r}, Self: r.host.ID(), Clock: r.cfg.Clock, Log: r.log,
		Linger: r.linger(), RenewWait: r.cfg.LeaseRenew, ReleaseWait: r.cfg.HeartbeatInterval,
		Watch: r.peers.Use, Gone: func(k leases.Key) { r.reader.Revoke(k) }})
}

// peerDied is called once per dead incarnation: refs held on it are gone,
// and leases it held on our objects go at once instead of at expiry.
func (r *Runtime) peerDied(id peer.ID, inc uint64, reason string) {
	r.log.Warn("peer died", "peer", shortID(id), "incarnation", fmt.Sprintf("%x", inc), "reason", reason)
	r.lifeMetrics.PeerDeaths.WithLabelValues(reason).Inc()
	r.leases.Drop(id, inc)
	r.objects.DropPeer(id) // and Expiring's next pass frees what they alone kept
}

// lifeLoop expires others' leases on this runtime's objects (its own
// leases as a reader are the lease table's: leases.Table.Keep). Expiry is
// checked a few times per expiry period so a lease outlives its deadline
// by at most a quarter of it.
func (r *Runtime) lifeLoop(ctx context.Context) {
	defer r.loops.Done()
	r.objects.Expiring(ctx, r.cfg.Clock, r.cfg.LeaseExpiry/4, r.expireLeases)
}

func (r *Runtime) expireLeases() {
	if n := r.objects.Expire(r.cfg.Clock.Now()); n > 0 {
		r.lifeMetrics.LeasesExpired.Add(float64(n))
		r.log.Info("reader leases expired", "count", n)
	}
}
