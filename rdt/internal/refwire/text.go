package refwire

import (
	"fmt"
	"net/url"
	"strings"

	"github.com/libp2p/go-libp2p/core/peer"
	ma "github.com/multiformats/go-multiaddr"

	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// Text forms of addresses, so processes can bootstrap with nothing but a
// string (a flag, a file, an environment variable, a Ray actor call):
//
//	trainer@/ip4/127.0.0.1/tcp/40123/p2p/12D3KooW...
//	trainer@/p2p/12D3KooW...                     (no addresses known)
//
// The actor name is query-escaped; several addresses are comma-separated,
// each a full multiaddr ending in /p2p/<peer ID>.

// FormatActor is an actor address's text form.
func FormatActor(name string, info peer.AddrInfo) (string, error) {
	if info.ID == "" || name == "" {
		return "", fmt.Errorf("%w: actor address needs a name and a peer", errs.MalformedAddr)
	}
	return url.QueryEscape(name) + "@" + FormatAddrInfo(info), nil
}

// ParseActor parses FormatActor's form, "name@multiaddrs".
func ParseActor(s string) (name string, info peer.AddrInfo, err error) {
	esc, rest, ok := strings.Cut(s, "@")
	if !ok {
		return "", info, fmt.Errorf("%w: %q: want name@/ip4/.../p2p/<peer>", errs.MalformedAddr, s)
	}
	n, err := url.QueryUnescape(esc)
	if err != nil || n == "" || len(n) > maxString {
		return "", info, fmt.Errorf("%w: actor name %q", errs.MalformedAddr, esc)
	}
	info, err = ParseAddrInfo(rest)
	if err != nil {
		return "", info, err
	}
	return n, info, nil
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
		return out, fmt.Errorf("%w: empty", errs.MalformedAddr)
	}
	for part := range strings.SplitSeq(s, ",") {
		m, err := ma.NewMultiaddr(strings.TrimSpace(part))
		if err != nil {
			return peer.AddrInfo{}, fmt.Errorf("%w: %q: %v", errs.MalformedAddr, part, err)
		}
		transport, id := peer.SplitAddr(m)
		if id == "" {
			return peer.AddrInfo{}, fmt.Errorf("%w: %q has no /p2p/<peer> part", errs.MalformedAddr, part)
		}
		if out.ID != "" && out.ID != id {
			return peer.AddrInfo{}, fmt.Errorf("%w: addresses name two peers, %s and %s", errs.MalformedAddr, ShortID(out.ID), ShortID(id))
		}
		out.ID = id
		if transport != nil {
			out.Addrs = append(out.Addrs, transport)
		}
	}
	return out, nil
}
