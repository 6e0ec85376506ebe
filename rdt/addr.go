package rdt

import (
	"errors"
	"fmt"
	"net/url"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"
)

// Text forms of addresses, so processes can bootstrap with nothing but a
// string (a flag, a file, an environment variable, a Ray actor call):
//
//	trainer@/ip4/127.0.0.1/tcp/40123/p2p/12D3KooW...
//	trainer@/p2p/12D3KooW...                     (no addresses known)
//
// The actor name is query-escaped; several addresses are comma-separated,
// each a full multiaddr ending in /p2p/<peer ID>.

// ErrMalformedAddr: a text address that does not parse.
var ErrMalformedAddr = errors.New("rdt: malformed address")

// MarshalText returns the address's text form (see ParseActorAddr).
func (a ActorAddr) MarshalText() ([]byte, error) {
	if a.Peer == "" || a.Name == "" {
		return nil, fmt.Errorf("%w: actor address needs a name and a peer", ErrMalformedAddr)
	}
	return []byte(url.QueryEscape(a.Name) + "@" + FormatAddrInfo(a.AddrInfo())), nil
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
	name, rest, ok := strings.Cut(s, "@")
	if !ok {
		return ActorAddr{}, fmt.Errorf("%w: %q: want name@/ip4/.../p2p/<peer>", ErrMalformedAddr, s)
	}
	n, err := url.QueryUnescape(name)
	if err != nil || n == "" || len(n) > maxRefString {
		return ActorAddr{}, fmt.Errorf("%w: actor name %q", ErrMalformedAddr, name)
	}
	info, err := ParseAddrInfo(rest)
	if err != nil {
		return ActorAddr{}, err
	}
	return ActorAddr{Peer: info.ID, Name: n, Addrs: info.Addrs}, nil
}

// FormatAddrInfo writes a runtime's peer ID and control addresses as
// comma-separated /p2p multiaddrs (just /p2p/<id> without addresses).
func FormatAddrInfo(info peer.AddrInfo) string {
	suffix := "/p2p/" + info.ID.String()
	if len(info.Addrs) == 0 {
		return suffix
	}
	parts := make([]string, len(info.Addrs))
	for i, a := range info.Addrs {
		parts[i] = a.String() + suffix
	}
	return strings.Join(parts, ",")
}

// ParseAddrInfo parses FormatAddrInfo's form. Every address must name the
// same peer.
func ParseAddrInfo(s string) (peer.AddrInfo, error) {
	var out peer.AddrInfo
	if s == "" {
		return out, fmt.Errorf("%w: empty", ErrMalformedAddr)
	}
	for part := range strings.SplitSeq(s, ",") {
		m, err := ma.NewMultiaddr(strings.TrimSpace(part))
		if err != nil {
			return peer.AddrInfo{}, fmt.Errorf("%w: %q: %v", ErrMalformedAddr, part, err)
		}
		transport, id := peer.SplitAddr(m)
		if id == "" {
			return peer.AddrInfo{}, fmt.Errorf("%w: %q has no /p2p/<peer> part", ErrMalformedAddr, part)
		}
		if out.ID != "" && out.ID != id {
			return peer.AddrInfo{}, fmt.Errorf("%w: addresses name two peers, %s and %s", ErrMalformedAddr, shortID(out.ID), shortID(id))
		}
		out.ID = id
		if transport != nil {
			out.Addrs = append(out.Addrs, transport)
		}
	}
	return out, nil
}
