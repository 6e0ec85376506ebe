package rdt

import (
	"context"
	"time"

	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"

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
