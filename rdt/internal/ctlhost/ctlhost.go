// Package ctlhost builds the libp2p host of rdt's control plane (tcp,
// Noise, yamux, no relay; a private network when there is a cluster key;
// an allowlist enforced once a peer's identity is authenticated) and keeps
// what it knows of peers' addresses. rdt's protocols (ctlmsg, life, the
// push notices) run on the host it returns.
package ctlhost

import (
	"fmt"

	"github.com/libp2p/go-libp2p"
	"github.com/libp2p/go-libp2p/core/control"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/host"
	"github.com/libp2p/go-libp2p/core/network"
	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/libp2p/go-libp2p/core/peerstore"
	"github.com/libp2p/go-libp2p/core/pnet"
	"github.com/libp2p/go-libp2p/p2p/muxer/yamux"
	"github.com/libp2p/go-libp2p/p2p/net/swarm"
	"github.com/libp2p/go-libp2p/p2p/security/noise"
	libp2ptcp "github.com/libp2p/go-libp2p/p2p/transport/tcp"
	ma "github.com/multiformats/go-multiaddr"
)

// Config is what a control host is built from.
type Config struct {
	Identity    crypto.PrivKey
	ListenAddrs []string
	// ClusterKey, when set, makes a private network: connections from
	// peers without the key fail before any libp2p protocol runs.
	ClusterKey []byte
	// Authorize, when set, admits (true) or refuses each authenticated
	// peer; it says why it refused one (the log).
	Authorize func(peer.ID) bool
}

// New starts a control host.
func New(c Config) (host.Host, error) {
	listen := make([]ma.Multiaddr, 0, len(c.ListenAddrs))
	for _, a := range c.ListenAddrs {
		m, err := ma.NewMultiaddr(a)
		if err != nil {
			return nil, fmt.Errorf("ctlhost: listen address %q: %w", a, err)
		}
		listen = append(listen, m)
	}
	opts := []libp2p.Option{
		libp2p.Identity(c.Identity),
		// The host starts without listening, and listens below: when
		// libp2p.New itself fails to listen (a port in use) it leaves the
		// peerstore's, connection manager's and swarm's goroutines running
		// (go-libp2p v0.52), where h.Close after our own Listen stops all.
		libp2p.NoListenAddrs,
		libp2p.Transport(libp2ptcp.NewTCPTransport),
		libp2p.Security(noise.ID, noise.New),
		libp2p.Muxer(yamux.ID, yamux.DefaultTransport),
		libp2p.DisableRelay(),
		libp2p.ResourceManager(&network.NullResourceManager{}),
	}
	if c.ClusterKey != nil {
		opts = append(opts, libp2p.PrivateNetwork(pnet.PSK(c.ClusterKey)))
	}
	if c.Authorize != nil {
		opts = append(opts, libp2p.ConnectionGater(gater(c.Authorize)))
	}
	h, err := libp2p.New(opts...)
	if err != nil {
		return nil, err
	}
	if len(listen) > 0 {
		if err := h.Network().Listen(listen...); err != nil {
			h.Close()
			return nil, err
		}
	}
	return h, nil
}

// gater enforces Config.Authorize on connections, once the remote's
// identity is authenticated.
type gater func(peer.ID) bool

func (gater) InterceptPeerDial(peer.ID) bool                                  { return true }
func (gater) InterceptAddrDial(peer.ID, ma.Multiaddr) bool                    { return true }
func (gater) InterceptAccept(network.ConnMultiaddrs) bool                     { return true }
func (gater) InterceptUpgraded(network.Conn) (bool, control.DisconnectReason) { return true, 0 }
func (g gater) InterceptSecured(_ network.Direction, id peer.ID, _ network.ConnMultiaddrs) bool {
	return g(id)
}

// Learn adds id's addresses (multiaddr strings; malformed ones are
// skipped) to h's peerstore for a while, so the control channel can reach
// a peer h never connected to.
func Learn(h host.Host, id peer.ID, addrs []string) {
	var ms []ma.Multiaddr
	for _, a := range addrs {
		if m, err := ma.NewMultiaddr(a); err == nil {
			ms = append(ms, m)
		}
	}
	if len(ms) > 0 {
		h.Peerstore().AddAddrs(id, ms, peerstore.TempAddrTTL)
	}
}

// OnLastDisconnect calls f with each peer whose last connection to h
// closed (only that loss matters to a failure detector: it re-dials to
// tell a dead peer from a dropped connection).
func OnLastDisconnect(h host.Host, f func(peer.ID)) {
	h.Network().Notify(&network.NotifyBundle{DisconnectedF: func(n network.Network, c network.Conn) {
		if n.Connectedness(c.RemotePeer()) != network.Connected {
			f(c.RemotePeer())
		}
	}})
}

// ClearBackoff lets h's next dial to id go out at once, whatever earlier
// dials failed.
func ClearBackoff(h host.Host, id peer.ID) {
	if sw, ok := h.Network().(*swarm.Swarm); ok {
		sw.Backoff().Clear(id)
	}
}
