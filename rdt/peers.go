package rdt

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/rdt/internal/ctlhost"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/peers"
)

// PeerEventKind says what happened to a watched peer.
type PeerEventKind int

const (
	// PeerAlive: an incarnation of the peer answered for the first time
	// (after a restart, a new incarnation).
	PeerAlive = PeerEventKind(peers.Alive)
	// PeerDied: the incarnation stopped answering.
	PeerDied = PeerEventKind(peers.Died)
)

func (k PeerEventKind) String() string {
	switch k {
	case PeerAlive:
		return "alive"
	case PeerDied:
		return "died"
	}
	return "unknown"
}

// PeerEvent reports a change in a watched peer's liveness.
type PeerEvent struct {
	Peer        peer.ID
	Kind        PeerEventKind
	Incarnation uint64 // the incarnation that came alive or died; 0 if it never answered
	Reason      string // for PeerDied: "connection lost", "missed 3 heartbeats", "restarted"
	At          time.Time
}

// lifeMetrics count the lifecycle machinery.
type lifeMetrics struct {
	heartbeats    *prometheus.CounterVec // tensorlane_heartbeats_total{result}
	peerDeaths    *prometheus.CounterVec // tensorlane_peer_deaths_total{reason}
	leaseRequests *prometheus.CounterVec // tensorlane_lease_requests_total{op}
	leaseMessages *prometheus.CounterVec // tensorlane_lease_messages_total{op}
	leasesExpired prometheus.Counter     // tensorlane_leases_expired_total
	leasesHeld    prometheus.GaugeFunc   // tensorlane_leases_held (this runtime's, as a reader)
	leasesGranted prometheus.GaugeFunc   // tensorlane_leases_granted (on this runtime's objects)
	objectsFreed  *prometheus.CounterVec // tensorlane_objects_freed_total{why}
	ownerDied     prometheus.Counter     // tensorlane_owner_died_errors_total
}

func newLifeMetrics(reg prometheus.Registerer, r *Runtime) *lifeMetrics {
	m := &lifeMetrics{
		heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_heartbeats_total", Help: "Heartbeats sent to watched peers, by result (ok, missed).",
		}, []string{"result"}),
		peerDeaths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_peer_deaths_total", Help: "Peer incarnations declared dead, by reason.",
		}, []string{"reason"}),
		leaseRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_lease_requests_total", Help: "Lease claims served by this runtime as owner, by op (lease, release).",
		}, []string{"op"}),
		leaseMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_lease_messages_total", Help: "Lease messages (each carrying many claims) served by this runtime as owner, by op (lease, release).",
		}, []string{"op"}),
		leasesExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_leases_expired_total", Help: "Reader leases on this runtime's objects that expired without renewal.",
		}),
		leasesHeld: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tensorlane_leases_held", Help: "Refs this runtime holds leases on, as a reader.",
		}, func() float64 { return float64(r.holdCount()) }),
		leasesGranted: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tensorlane_leases_granted", Help: "Reader leases on this runtime's objects.",
		}, func() float64 { return float64(r.objects.Leases()) }),
		objectsFreed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_objects_freed_total", Help: "Objects removed from the object table, by cause.",
		}, []string{"why"}),
		ownerDied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_owner_died_errors_total", Help: "Gets that failed with ErrOwnerDied.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.heartbeats, m.peerDeaths, m.leaseRequests, m.leaseMessages, m.leasesExpired, m.leasesHeld, m.leasesGranted, m.objectsFreed, m.ownerDied)
	}
	return m
}

// peerProber is the runtime as its failure detector sees it (peers.Prober).
type peerProber struct{ r *Runtime }

func (p peerProber) Ping(ctx context.Context, id peer.ID) (uint64, error) {
	reply, err := p.r.call(ctx, id, ctlwire.LifeMsg{Kind: ctlwire.LifePing})
	return reply.Incarnation, err
}

func (p peerProber) Connected(id peer.ID) bool {
	return p.r.host.Network().Connectedness(id) == network.Connected
}

func (p peerProber) ClearBackoff(id peer.ID) {
	// A re-dial right after a lost connection must not be refused by the
	// swarm's backoff from an earlier failure.
	ctlhost.ClearBackoff(p.r.host, id)
}

func (p peerProber) Died(id peer.ID, inc uint64, reason string) { p.r.peerDied(id, inc, reason) }

// peerEvent is ev as rdt names it.
func peerEvent(ev peers.Event) PeerEvent {
	return PeerEvent{Peer: ev.Peer, Kind: PeerEventKind(ev.Kind), Incarnation: ev.Incarnation, Reason: ev.Reason, At: ev.At}
}
