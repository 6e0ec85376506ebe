// Package refwire is the wire form of rdt's Ref and the text form of its
// addresses: the bytes a ref marshals to (version 1), the control addresses
// it carries, and "name@multiaddrs" actor addresses. rdt.Ref converts to
// and from Ref here (the two have the same fields), so the packages behind
// rdt can name refs without importing rdt.
//
// The encoding is wire format: it changes only with a new version byte,
// and rdt's golden and fuzz tests (rdt/rdt_test.go) hold it to that.
package refwire

import (
	"fmt"
	"slices"
	"sort"
	"sync"
	"sync/atomic"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/multiformats/go-multiaddr"
	manet "github.com/multiformats/go-multiaddr/net"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/tensor"
)

// Ref has rdt.Ref's fields (documented there), so that each converts to
// the other.
type Ref struct {
	Object      fabric.ObjectID
	Owner       peer.ID
	Incarnation uint64
	Addrs       []string
	DataAddrs   map[string]string
	Host        string
	Device      tensor.DeviceID
	Desc        tensor.Desc
	Transports  []string
	Token       []byte
}

const (
	magic0, magic1 = 'T', 'R'
	version        = 1
	// MaxAddrs bounds the control and the data addresses a ref carries.
	MaxAddrs  = 16
	maxString = ctlwire.MaxString
	maxToken  = ctlwire.MaxToken
)

// Span is the byte range of the owner's buffer the ref's tensor touches.
func (r Ref) Span() (off, n int64) {
	s, e := r.Desc.Span()
	return s, e - s
}

// Marshal encodes r (version 1). A ref with more addresses than a reader
// accepts is refused here, where the mistake is, rather than on every
// reader.
func Marshal(r Ref) ([]byte, error) {
	if len(r.Addrs) > MaxAddrs || len(r.DataAddrs) > MaxAddrs {
		return nil, fmt.Errorf("rdt: a ref carries at most %d control and %d data addresses (have %d and %d)",
			MaxAddrs, MaxAddrs, len(r.Addrs), len(r.DataAddrs))
	}
	e := wire.Encoder{Buf: make([]byte, 0, 256)}
	e.Byte(magic0)
	e.Byte(magic1)
	e.Byte(version)
	e.Fixed(r.Object[:])
	e.Bytes([]byte(r.Owner))
	e.Uvarint(r.Incarnation)
	e.Uvarint(uint64(len(r.Addrs)))
	for _, a := range r.Addrs {
		e.String(a)
	}
	names := make([]string, 0, len(r.DataAddrs))
	for n := range r.DataAddrs {
		names = append(names, n)
	}
	sort.Strings(names) // deterministic bytes
	e.Uvarint(uint64(len(names)))
	for _, n := range names {
		e.String(n)
		e.String(r.DataAddrs[n])
	}
	e.String(r.Host)
	e.String(string(r.Device.Kind))
	e.Uvarint(uint64(r.Device.Index))
	e.Byte(byte(r.Desc.DType))
	e.Uvarint(uint64(len(r.Desc.Shape)))
	for _, s := range r.Desc.Shape {
		e.Uvarint(uint64(s))
	}
	if r.Desc.Strides == nil {
		e.Byte(0)
	} else {
		e.Byte(1)
		for _, s := range r.Desc.Strides {
			e.Uvarint(uint64(s))
		}
	}
	e.Uvarint(uint64(r.Desc.Offset))
	e.Byte(fabric.WireMask(r.Transports))
	e.Bytes(r.Token)
	return e.Buf, nil
}

// Unmarshal decodes a ref, checking every field. Malformed input returns
// an error matching errs.MalformedRef; it never panics.
func Unmarshal(p []byte) (Ref, error) {
	d := wire.NewDecoder(p)
	if d.Byte() != magic0 || d.Byte() != magic1 {
		return Ref{}, fmt.Errorf("%w: not a tensorlane ref", errs.MalformedRef)
	}
	if v := d.Byte(); v != version {
		return Ref{}, fmt.Errorf("%w: version %d, this build reads %d", errs.MalformedRef, v, version)
	}
	var out Ref
	d.Fixed(out.Object[:])
	owner := d.Bytes(128)
	out.Incarnation = d.Uvarint()
	for n := d.Count(MaxAddrs); n > 0; n-- {
		out.Addrs = append(out.Addrs, d.String(maxString))
	}
	if n := d.Count(MaxAddrs); n > 0 {
		out.DataAddrs = make(map[string]string, n)
		for ; n > 0; n-- {
			name := d.String(32)
			out.DataAddrs[name] = d.String(maxString)
		}
	}
	out.Host = d.String(maxString)
	out.Device.Kind = tensor.DeviceKind(d.String(32))
	idx := d.Uvarint()
	out.Device.Index = int(min(idx, 1<<16+1))
	out.Desc.DType = tensor.DType(d.Byte())
	ndim := d.Count(tensor.MaxDims)
	if ndim > 0 {
		out.Desc.Shape = make([]int64, ndim)
	} else {
		out.Desc.Shape = []int64{}
	}
	for i := range out.Desc.Shape {
		out.Desc.Shape[i] = int64(min(d.Uvarint(), 1<<62))
	}
	if d.Byte() == 1 {
		out.Desc.Strides = make([]int64, ndim)
		for i := range out.Desc.Strides {
			out.Desc.Strides[i] = int64(min(d.Uvarint(), 1<<62))
		}
	}
	out.Desc.Offset = int64(min(d.Uvarint(), 1<<62))
	out.Transports = fabric.FromWireMask(d.Byte())
	out.Token = d.Bytes(maxToken)
	if err := d.Finish(); err != nil {
		return Ref{}, fmt.Errorf("%w: %v", errs.MalformedRef, err)
	}
	id, err := peer.IDFromBytes(owner)
	if err != nil {
		return Ref{}, fmt.Errorf("%w: owner: %v", errs.MalformedRef, err)
	}
	out.Owner = id
	dev, err := tensor.ParseDeviceID(fmt.Sprintf("%s:%d", out.Device.Kind, idx))
	if err != nil {
		return Ref{}, fmt.Errorf("%w: device: %v", errs.MalformedRef, err)
	}
	out.Device = dev
	if err := out.Desc.Validate(); err != nil {
		return Ref{}, fmt.Errorf("%w: %v", errs.MalformedRef, err)
	}
	return out, nil
}

// Addrs picks the control addresses a ref carries: at most MaxAddrs (what
// every reader parses), the ones most likely to reach the owner from
// another host first. A runtime listening on 0.0.0.0 of a host with many
// addresses (container bridges, many NICs) would otherwise write a ref that
// no reader can parse.
func Addrs(ms []multiaddr.Multiaddr) []string {
	rank := func(m multiaddr.Multiaddr) int {
		ip, err := manet.ToIP(m)
		switch {
		case err != nil:
			return 1 // dns and the like: may well be routable
		case ip.IsLoopback():
			return 3
		case ip.IsLinkLocalUnicast():
			return 2
		default:
			return 0
		}
	}
	ms = slices.Clone(ms)
	slices.SortStableFunc(ms, func(a, b multiaddr.Multiaddr) int { return rank(a) - rank(b) })
	out := make([]string, 0, min(len(ms), MaxAddrs))
	for _, m := range ms {
		if s := m.String(); len(out) < MaxAddrs && len(s) <= maxString && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// ShortID is a peer's name in logs and messages: the last characters of
// its ID.
func ShortID(id peer.ID) string {
	s := PeerString(id)
	if len(s) > 10 {
		return "…" + s[len(s)-8:]
	}
	return s
}

// PeerString is id.String() (base58, which costs more than a small Get's
// bookkeeping should), remembered for the few peers a runtime talks to.
func PeerString(id peer.ID) string {
	if s, ok := peerStrings.Load(id); ok {
		return s.(string)
	}
	s := id.String()
	if peerStringCount.Add(1) <= maxPeerStrings { // forged refs must not grow it without bound
		peerStrings.Store(id, s)
	}
	return s
}

var (
	peerStrings     sync.Map // peer.ID -> string
	peerStringCount atomic.Int64
)

const maxPeerStrings = 1 << 12

// MarshalBinary is Marshal, so that a Ref rides the broadcast notices
// (bcast.Msg).
func (r Ref) MarshalBinary() ([]byte, error) { return Marshal(r) }
