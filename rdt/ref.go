package rdt

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
	"github.com/tensorlane/tensorlane/tensor"
)

// Ref is a small, serializable reference to a tensor that stays in its
// owner's device memory. It carries everything a reader needs to fetch the
// bytes directly: the owner's identity and addresses, where the tensor lives,
// its layout, the transports the owner serves, and an unguessable capability
// token. It marshals to a few hundred bytes, so it can ride any control
// channel (ours, Ray actor calls, gRPC).
type Ref struct {
	Object      fabric.ObjectID
	Owner       peer.ID
	Incarnation uint64            // the owner runtime's life; a restarted owner has a new one
	Addrs       []string          // owner's control multiaddrs
	DataAddrs   map[string]string // transport name -> data address
	Host        string            // owner's topology host
	Device      tensor.DeviceID
	Desc        tensor.Desc
	Transports  []string // transports the owner serves
	Token       []byte   // capability: whoever holds the ref may read the object
}

const (
	refMagic0, refMagic1 = 'T', 'R'
	refVersion           = 1
	maxRefAddrs          = 16
	maxRefString         = ctlwire.MaxString
	maxTokenLen          = ctlwire.MaxToken
)

func (r Ref) String() string {
	return fmt.Sprintf("ref %s (%v on %s/%v, owner %s)", r.Object, r.Desc, r.Host, r.Device, shortID(r.Owner))
}

func shortID(id peer.ID) string {
	s := peerString(id)
	if len(s) > 10 {
		return "…" + s[len(s)-8:]
	}
	return s
}

// peerString is id.String() (base58, which costs more than a small Get's
// bookkeeping should), remembered for the few peers a runtime talks to.
func peerString(id peer.ID) string {
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

// refAddrs picks the control addresses a ref carries: at most maxRefAddrs
// (what every reader parses), the ones most likely to reach the owner from
// another host first. A runtime listening on 0.0.0.0 of a host with many
// addresses (container bridges, many NICs) would otherwise write a ref that
// no reader can parse.
func refAddrs(ms []multiaddr.Multiaddr) []string {
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
	out := make([]string, 0, min(len(ms), maxRefAddrs))
	for _, m := range ms {
		if s := m.String(); len(out) < maxRefAddrs && len(s) <= maxRefString && !slices.Contains(out, s) {
			out = append(out, s)
		}
	}
	return out
}

// MarshalBinary encodes the ref (version 1). A ref with more addresses than
// a reader accepts is refused here, where the mistake is, rather than on
// every reader.
func (r Ref) MarshalBinary() ([]byte, error) {
	if len(r.Addrs) > maxRefAddrs || len(r.DataAddrs) > maxRefAddrs {
		return nil, fmt.Errorf("rdt: a ref carries at most %d control and %d data addresses (have %d and %d)",
			maxRefAddrs, maxRefAddrs, len(r.Addrs), len(r.DataAddrs))
	}
	e := wire.Encoder{Buf: make([]byte, 0, 256)}
	e.Byte(refMagic0)
	e.Byte(refMagic1)
	e.Byte(refVersion)
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

// UnmarshalBinary decodes a ref, checking every field. Malformed input
// returns an error matching ErrMalformedRef; it never panics.
func (r *Ref) UnmarshalBinary(p []byte) error {
	d := wire.NewDecoder(p)
	if d.Byte() != refMagic0 || d.Byte() != refMagic1 {
		return fmt.Errorf("%w: not a tensorlane ref", ErrMalformedRef)
	}
	if v := d.Byte(); v != refVersion {
		return fmt.Errorf("%w: version %d, this build reads %d", ErrMalformedRef, v, refVersion)
	}
	var out Ref
	d.Fixed(out.Object[:])
	owner := d.Bytes(128)
	out.Incarnation = d.Uvarint()
	for n := d.Count(maxRefAddrs); n > 0; n-- {
		out.Addrs = append(out.Addrs, d.String(maxRefString))
	}
	if n := d.Count(maxRefAddrs); n > 0 {
		out.DataAddrs = make(map[string]string, n)
		for ; n > 0; n-- {
			name := d.String(32)
			out.DataAddrs[name] = d.String(maxRefString)
		}
	}
	out.Host = d.String(maxRefString)
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
	out.Token = d.Bytes(maxTokenLen)
	if err := d.Finish(); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformedRef, err)
	}
	id, err := peer.IDFromBytes(owner)
	if err != nil {
		return fmt.Errorf("%w: owner: %v", ErrMalformedRef, err)
	}
	out.Owner = id
	dev, err := tensor.ParseDeviceID(fmt.Sprintf("%s:%d", out.Device.Kind, idx))
	if err != nil {
		return fmt.Errorf("%w: device: %v", ErrMalformedRef, err)
	}
	out.Device = dev
	if err := out.Desc.Validate(); err != nil {
		return fmt.Errorf("%w: %v", ErrMalformedRef, err)
	}
	*r = out
	return nil
}

// span is the byte range of the owner's buffer the ref's tensor touches.
func (r Ref) span() (off, n int64) {
	s, e := r.Desc.Span()
	return s, e - s
}

// ParseRef decodes a marshalled ref.
func ParseRef(p []byte) (Ref, error) {
	var r Ref
	err := r.UnmarshalBinary(p)
	return r, err
}
