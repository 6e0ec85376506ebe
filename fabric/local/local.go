// Package local implements the in-process transports: "local", which hands a
// reader on the owner's device a zero-copy view and copies between devices
// of one runtime directly, and "p2p", the direct device-to-device copy
// between devices that the topology joins with a device link (NVLink, xGMI).
// On simulated devices both are real memory copies between arenas.
//
// Both serve only readers in the owner's own runtime: runtimes that claim
// different hosts in one process are different hosts to the planner.
package local

import (
	"context"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/pcopy"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// Config configures the in-process transports.
type Config struct {
	Process  string            // this runtime's instance ID (fabric.Endpoint.Process)
	Source   fabric.Source     // this runtime's object table
	Sink     fabric.Sink       // this runtime's push slots; nil refuses pushes
	Topology *topology.Cluster // may be nil: then no device links are known
}

// chunk bounds how long a copy runs between context checks.
const chunk = 8 << 20

// memcpyGBps is the planning estimate for a single-thread host copy.
const memcpyGBps = 20

// Transport is the "local" transport.
type Transport struct {
	cfg    Config
	closed atomic.Bool
}

// P2P is the "p2p" transport between linked devices of one runtime.
type P2P struct {
	cfg    Config
	closed atomic.Bool
}

var (
	_ fabric.Transport = (*Transport)(nil)
	_ fabric.Viewer    = (*Transport)(nil)
	_ fabric.Transport = (*P2P)(nil)
	_ fabric.Writer    = (*Transport)(nil)
	_ fabric.Writer    = (*P2P)(nil)
)

// New returns the "local" transport.
func New(cfg Config) *Transport { return &Transport{cfg: cfg} }

// NewP2P returns the "p2p" transport.
func NewP2P(cfg Config) *P2P { return &P2P{cfg: cfg} }

func (t *Transport) Name() string { return fabric.Local }

func sameProcess(cfg Config, src, dst fabric.Endpoint) bool {
	return cfg.Process != "" && src.Process == cfg.Process && dst.Process == cfg.Process
}

// Reach serves every pair inside this runtime.
func (t *Transport) Reach(src, dst fabric.Endpoint) (fabric.Cost, bool) {
	if !sameProcess(t.cfg, src, dst) {
		return fabric.Cost{Reason: "owner is in another runtime"}, false
	}
	if src.Device == dst.Device {
		return fabric.Cost{Path: topology.Path{Class: topology.PathSELF}, GBps: math.Inf(1), Reason: "same device: zero-copy view"}, true
	}
	return fabric.Cost{GBps: memcpyGBps, Reason: "same runtime: direct copy between devices"}, true
}

// View pins the owner's buffer and returns it: no byte moves.
func (t *Transport) View(ctx context.Context, src fabric.Remote) (tensor.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if t.closed.Load() {
		return nil, fabric.ErrClosed
	}
	return t.cfg.Source.Open(ctx, src.Claim.For(src.Offset, src.Length))
}

// Read copies the object into dst.
func (t *Transport) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	if t.closed.Load() {
		return fabric.Stats{}, fabric.ErrClosed
	}
	return copyFrom(ctx, t.cfg.Source, fabric.Local, src, dst)
}

// Write copies src into a push slot of this runtime.
func (t *Transport) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	if t.closed.Load() {
		return fabric.Stats{}, fabric.ErrClosed
	}
	return copyInto(ctx, t.cfg.Sink, fabric.Local, src, dst)
}

// Close refuses later calls with fabric.ErrClosed (it holds no resources
// to free; calls in flight finish). It is idempotent.
func (t *Transport) Close() error {
	t.closed.Store(true)
	return nil
}

func (t *P2P) Name() string { return fabric.P2P }

// Reach serves pairs of distinct devices in this runtime that share a device
// link in the topology.
func (t *P2P) Reach(src, dst fabric.Endpoint) (fabric.Cost, bool) {
	if !sameProcess(t.cfg, src, dst) {
		return fabric.Cost{Reason: "owner is in another runtime (cross-process p2p is fabric/shm's)"}, false
	}
	if src.Device == dst.Device {
		return fabric.Cost{Reason: "same device: nothing to copy"}, false
	}
	if t.cfg.Topology == nil {
		return fabric.Cost{Reason: "no topology: device links unknown"}, false
	}
	path := t.cfg.Topology.PathBetween(src.TopologyEndpoint(), dst.TopologyEndpoint())
	if path.Class != topology.PathNV {
		return fabric.Cost{Path: path, Reason: fmt.Sprintf("devices not linked (path %v)", path)}, false
	}
	return fabric.Cost{Path: path, GBps: path.GBps, Reason: fmt.Sprintf("device link %v (%s, %.0f GB/s)", path, path.Link, path.GBps)}, true
}

// Read copies the object straight from the owner device's arena into dst.
func (t *P2P) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	if t.closed.Load() {
		return fabric.Stats{}, fabric.ErrClosed
	}
	return copyFrom(ctx, t.cfg.Source, fabric.P2P, src, dst)
}

// Write copies src over the device link into a push slot of this runtime.
func (t *P2P) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	if t.closed.Load() {
		return fabric.Stats{}, fabric.ErrClosed
	}
	return copyInto(ctx, t.cfg.Sink, fabric.P2P, src, dst)
}

// Close refuses later calls with fabric.ErrClosed. It is idempotent.
func (t *P2P) Close() error {
	t.closed.Store(true)
	return nil
}

func copyFrom(ctx context.Context, source fabric.Source, name string, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	start := time.Now()
	pin, err := source.Open(ctx, src.Claim.For(src.Offset, src.Length))
	if err != nil {
		return fabric.Stats{}, err
	}
	defer pin.Release()
	if err := fabric.CheckRange(src.Offset, src.Length, pin.Len()); err != nil {
		return fabric.Stats{}, err
	}
	if dst.Len() < src.Length {
		return fabric.Stats{}, fmt.Errorf("%w: destination holds %d of %d bytes", tensor.ErrTooSmall, dst.Len(), src.Length)
	}
	from, ferr := tensor.BytesOf(pin)
	to, terr := tensor.BytesOf(dst)
	if ferr != nil || terr != nil {
		// Device memory the CPU cannot address (CUDA): its copy engines
		// move the bytes, device to device where they reach each other.
		if err := tensor.Copy(ctx, dst, 0, pin, src.Offset, src.Length); err != nil {
			return fabric.Stats{}, err
		}
	} else if err := chunkedCopy(ctx, to, from[src.Offset:src.Offset+src.Length]); err != nil {
		return fabric.Stats{}, err
	}
	return fabric.Stats{Transport: name, Bytes: src.Length, Duration: time.Since(start), Streams: 1}, nil
}

// copyInto writes dst.Length bytes of src into the sink slot dst names.
func copyInto(ctx context.Context, sink fabric.Sink, name string, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	start := time.Now()
	if sink == nil {
		return fabric.Stats{}, fmt.Errorf("%w: this runtime accepts no pushes", fabric.ErrObjectNotFound)
	}
	if src.Len() < dst.Length {
		return fabric.Stats{}, fmt.Errorf("%w: pushing %d bytes from a buffer of %d", fabric.ErrBadRequest, dst.Length, src.Len())
	}
	pin, err := sink.OpenSink(ctx, dst.Claim)
	if err != nil {
		return fabric.Stats{}, err
	}
	defer pin.Release()
	if err := fabric.CheckRange(dst.Offset, dst.Length, pin.Len()); err != nil {
		return fabric.Stats{}, err
	}
	from, ferr := tensor.BytesOf(src)
	to, terr := tensor.BytesOf(pin)
	if ferr != nil || terr != nil {
		if err := tensor.Copy(ctx, pin, dst.Offset, src, 0, dst.Length); err != nil {
			return fabric.Stats{}, err
		}
	} else if err := chunkedCopy(ctx, to[dst.Offset:dst.Offset+dst.Length], from[:dst.Length]); err != nil {
		return fabric.Stats{}, err
	}
	return fabric.Stats{Transport: name, Bytes: dst.Length, Duration: time.Since(start), Streams: 1}, nil
}

// chunkedCopy copies in chunks so a cancelled context stops a long copy.
func chunkedCopy(ctx context.Context, to, from []byte) error {
	// Large copies run on several cores: one cannot fill the memory
	// bandwidth (internal/pcopy).
	return pcopy.Copy(ctx, to, from, pcopy.Options{Chunk: chunk})
}
