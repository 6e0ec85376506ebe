package fabric

import (
	"context"
	"encoding/hex"
	"fmt"
	"time"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Transport names, best path first; registry.go says everything else
// about them.
const (
	Local = "local" // same process: zero-copy on one device, a direct copy otherwise
	P2P   = "p2p"   // device to device over a device link
	SHM   = "shm"   // same host through shared host memory
	RDMA  = "rdma"  // one-sided reads of registered memory through NICs
	TCP   = "tcp"   // anything reachable
)

// Endpoint says where bytes live, as the planner needs it: which runtime
// (Process), which simulated or real host, which device of that host.
type Endpoint struct {
	Process string // runtime instance; equal only within one Runtime
	Host    string // topology host ID
	Device  tensor.DeviceID
}

// TopologyEndpoint returns the topology's name for the endpoint's memory.
func (e Endpoint) TopologyEndpoint() topology.Endpoint {
	if e.Device.IsHost() {
		return topology.Endpoint{Host: e.Host, Device: topology.HostMemory}
	}
	return topology.Endpoint{Host: e.Host, Device: e.Device.Index}
}

func (e Endpoint) String() string { return e.Host + "/" + e.Device.String() }

// ObjectID names an object in its owner's object table.
type ObjectID [16]byte

func (id ObjectID) String() string { return hex.EncodeToString(id[:8]) }

// Claim is what a reader presents to an owner to read an object: its ID, the
// owner incarnation it was issued by, the capability token from the ref, and
// the byte range of the object's buffer it asks for.
type Claim struct {
	Object      ObjectID
	Incarnation uint64
	Token       []byte
	// Offset and Length are the range the read touches, in bytes from the
	// start of the object's buffer. A Source grants only ranges inside
	// what the owner published (a view grants its own bytes, not its
	// parent's), so every server passes the range it is about to serve:
	// use For. Leases and sinks ignore it.
	Offset, Length int64
}

// For returns the claim asking for [off, off+n) of the object's buffer.
func (c Claim) For(off, n int64) Claim {
	c.Offset, c.Length = off, n
	return c
}

// Remote tells a transport where to read from: the owner's endpoint and peer
// identity, the addresses of its data services by transport name, the claim,
// and the byte range of the object's buffer to move.
type Remote struct {
	Endpoint Endpoint
	Peer     string            // owner's peer ID (libp2p, string form)
	Addrs    map[string]string // transport name -> address, e.g. "tcp" -> "127.0.0.1:40123"
	Claim    Claim
	Offset   int64
	Length   int64
	// DType is the object's element type, a hint for transports that
	// compress (tcp); tensor.Invalid when unknown.
	DType tensor.DType
}

// Cost is a transport's estimate for moving bytes between two endpoints.
type Cost struct {
	Path   topology.Path
	GBps   float64 // estimated throughput, gigabytes per second
	Reason string  // why this transport can serve the pair
	// Stripes is the most rails (rdma) or connections (tcp) one transfer
	// is cut across; 0 when the transport does not stripe.
	Stripes int
}

// Stats describes one completed transfer.
type Stats struct {
	Transport string
	Bytes     int64
	Duration  time.Duration
	Streams   int  // parallel connections or rails used
	ZeroCopy  bool // nothing was copied: the reader got a view
	// ViewCopy: the owner served a private copy of the published view,
	// because the view is only part of its allocation and the path hands
	// the reader a descriptor (shm, p2p between processes).
	ViewCopy bool
	// Coalesced is, for an item of a batch (BatchReader, BatchWriter), how many items of
	// the same owner and path moved together with it (itself included):
	// they shared the owner round trips. 0 for a transfer on its own.
	Coalesced int
}

// GBps is the achieved throughput.
func (s Stats) GBps() float64 {
	if s.Duration <= 0 {
		return 0
	}
	return float64(s.Bytes) / s.Duration.Seconds() / 1e9
}

// Transport moves an object's bytes into a reader's buffer.
// Implementations: fabric/local (local, and p2p within one process),
// fabric/shm (p2p and shm between processes of one host), fabric/rdma
// (between hosts, over a verbs provider) and fabric/tcp (anything
// reachable).
type Transport interface {
	Name() string
	// Reach reports whether the transport can move bytes from src to dst,
	// and at what estimated cost.
	Reach(src, dst Endpoint) (Cost, bool)
	// Read pulls src's bytes into dst, which must hold src.Length bytes. On
	// error dst's contents are undefined and the reader must not use them.
	Read(ctx context.Context, src Remote, dst tensor.Buffer) (Stats, error)
	// Close releases connections and goroutines; it is idempotent.
	Close() error
}

// Variant is the optional capability of a transport that shares its path
// name with another implementation (fabric/local's and fabric/shm's p2p):
// Variant tells them apart in plans, e.g. "in-process", "cross-process".
type Variant interface {
	Variant() string
}

// Viewer is the optional capability of transports that can hand the reader
// the owner's own memory instead of a copy. The returned buffer pins the
// object; its Release unpins it.
type Viewer interface {
	View(ctx context.Context, src Remote) (tensor.Buffer, error)
}

// Writer is the optional capability of transports that can push: the owner
// writes an object's bytes into a buffer the reader allocated and exposed
// through its Sink (broadcast-style weight sync). dst.Claim names the
// reader's sink; dst.Length bytes of src are written at dst.Offset.
type Writer interface {
	Write(ctx context.Context, src tensor.Buffer, dst Remote) (Stats, error)
}

// Addressed is the optional capability of transports that reach the other
// side through a data address it publishes in Remote.Addrs. AddressOf
// returns the address the transport would use, or "" when the remote
// publishes none: the other side does not serve this transport, and the
// planner rules it out before trying rather than after a failed (and
// retried) attempt.
type Addressed interface {
	AddressOf(r Remote) string
}

// Sink is the reader side of a push: it resolves a claim to a buffer the
// reader allocated for the owner to write into. The returned buffer pins the
// sink until released; the reader sees the data only after the push returned
// without error.
type Sink interface {
	OpenSink(ctx context.Context, c Claim) (tensor.Buffer, error)
}

// Source is the owner side of every transport: it resolves a claim to the
// object's memory. The returned buffer pins the object for the duration of
// the read; releasing it unpins (it never frees memory another holder uses).
// A Source refuses (ErrUnauthorized) a claim whose range (Claim.Offset,
// Claim.Length) leaves what the owner published, and the buffer it returns
// is no longer than the published range's end, so a server's CheckRange
// against its Len is a second fence. A Source that is shutting down refuses
// new claims with ErrOwnerClosed.
type Source interface {
	Open(ctx context.Context, c Claim) (tensor.Buffer, error)
}

// SourceFunc adapts a function to Source.
type SourceFunc func(ctx context.Context, c Claim) (tensor.Buffer, error)

// Open calls f.
func (f SourceFunc) Open(ctx context.Context, c Claim) (tensor.Buffer, error) { return f(ctx, c) }

// CheckRange validates that [off, off+n) lies within a buffer of length size.
func CheckRange(off, n, size int64) error {
	if off < 0 || n < 0 || off > size || n > size-off {
		return fmt.Errorf("%w: range [%d,+%d) outside object of %d bytes", ErrBadRequest, off, n, size)
	}
	return nil
}

// PeerReason says why a peer-to-peer path serves a pair: "device link
// NV18 (nvlink, 450 GB/s)" or "PCIe peer-to-peer PIX (50 GB/s)".
func PeerReason(p topology.Path) string {
	if p.Link == topology.LinkPCIe {
		return fmt.Sprintf("PCIe peer-to-peer %v (%.0f GB/s)", p, p.GBps)
	}
	return fmt.Sprintf("device link %v (%s, %.0f GB/s)", p, p.Link, p.GBps)
}
