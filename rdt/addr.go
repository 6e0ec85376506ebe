package rdt

import (
	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
)

// Text forms of addresses, so processes can bootstrap with nothing but a
// string (a flag, a file, an environment variable, a Ray actor call):
//
//	trainer@/ip4/127.0.0.1/tcp/40123/p2p/12D3KooW...
//	trainer@/p2p/12D3KooW...                     (no addresses known)
//
// The actor name is query-escaped; several addresses are comma-separated,
// each a full multiaddr ending in /p2p/<peer ID>. Package refwire writes
// and parses them.

// ErrMalformedAddr: a text address that does not parse.
var ErrMalformedAddr = errs.MalformedAddr

// MarshalText returns the address's text form (see ParseActorAddr).
func (a ActorAddr) MarshalText() ([]byte, error) {
	s, err := refwire.FormatActor(a.Name, a.AddrInfo())
	return []byte(s), err
}

// UnmarshalText parses the form MarshalText writes.
func (a *ActorAddr) UnmarshalText(p []byte) error {
	v, err := ParseActorAddr(string(p))
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// MarshalBinary is MarshalText: the text form is compact and versionless.
func (a ActorAddr) MarshalBinary() ([]byte, error) { return a.MarshalText() }

// UnmarshalBinary is UnmarshalText.
func (a *ActorAddr) UnmarshalBinary(p []byte) error { return a.UnmarshalText(p) }

// AddrInfo is the runtime the actor lives on, for Runtime.Connect.
func (a ActorAddr) AddrInfo() peer.AddrInfo { return peer.AddrInfo{ID: a.Peer, Addrs: a.Addrs} }

// ParseActorAddr parses an actor address's text form, "name@multiaddrs".
func ParseActorAddr(s string) (ActorAddr, error) {
	name, info, err := refwire.ParseActor(s)
	if err != nil {
		return ActorAddr{}, err
	}
	return ActorAddr{Peer: info.ID, Name: name, Addrs: info.Addrs}, nil
}

// FormatAddrInfo writes a runtime's peer ID and control addresses as
// comma-separated /p2p multiaddrs (just /p2p/<id> without addresses).
func FormatAddrInfo(info peer.AddrInfo) string { return refwire.FormatAddrInfo(info) }

// ParseAddrInfo parses FormatAddrInfo's form. Every address must name the
// same peer.
func ParseAddrInfo(s string) (peer.AddrInfo, error) { return refwire.ParseAddrInfo(s) }
