package shm

import (
	"context"
	"fmt"
	"sync/atomic"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/pcopy"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// shmGBps is the planning estimate for one copy through shared memory: a
// single-thread memcpy, a little below the in-process copy.
const shmGBps = 15

// Transport is one view of a Client: "p2p" or "shm". Both move bytes the
// same way (the owner's object mapped into this process, one copy into the
// destination); they differ in which pairs of endpoints they claim.
type Transport struct {
	c       *Client
	name    string
	ownsCli bool // made by New/NewP2P: Close closes the client too
	closed  atomic.Bool
}

var (
	_ fabric.Transport = (*Transport)(nil)
	_ fabric.Writer    = (*Transport)(nil)
)

// New returns the "shm" transport with a client of its own.
func New(cfg Config) (*Transport, error) {
	c, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{c: c, name: fabric.SHM, ownsCli: true}, nil
}

// NewP2P returns the cross-process "p2p" transport with a client of its
// own.
func NewP2P(cfg Config) (*Transport, error) {
	c, err := NewClient(cfg)
	if err != nil {
		return nil, err
	}
	return &Transport{c: c, name: fabric.P2P, ownsCli: true}, nil
}

// SHM returns the "shm" view of c. Closing the view does not close c.
func (c *Client) SHM() *Transport { return &Transport{c: c, name: fabric.SHM} }

// P2P returns the "p2p" view of c. Closing the view does not close c.
func (c *Client) P2P() *Transport { return &Transport{c: c, name: fabric.P2P} }

// Client returns the client behind the view.
func (t *Transport) Client() *Client { return t.c }

// Name returns "p2p" or "shm".
func (t *Transport) Name() string { return t.name }

// Variant tells this p2p from fabric/local's in-process one in plans
// (shm has no namesake).
func (t *Transport) Variant() string {
	if t.name == fabric.P2P {
		return "cross-process"
	}
	return ""
}

// Reach serves owners in another process of the same host. shm takes any
// pair of devices; p2p only devices the topology joins with a device link,
// the path a real accelerator would copy over (CUDA IPC over NVLink).
func (t *Transport) Reach(src, dst fabric.Endpoint) (fabric.Cost, bool) {
	switch {
	case src.Host == "" || src.Host != dst.Host:
		return fabric.Cost{Reason: "owner is on another host"}, false
	case src.Process == "" || src.Process == dst.Process:
		return fabric.Cost{Reason: "owner is in this runtime: the local transports serve it"}, false
	}
	var path topology.Path
	if topo := t.c.cfg.Topology; topo != nil {
		path = topo.PathBetween(src.TopologyEndpoint(), dst.TopologyEndpoint())
	}
	if t.name == fabric.SHM {
		if t.c.cfg.Topology == nil {
			path = topology.Path{Class: topology.PathSYS} // unknown: assume the worst same-host path
		}
		return fabric.Cost{Path: path, GBps: shmGBps, Reason: "same host, another process: copy through the owner's object mapped read-only"}, true
	}
	switch {
	case t.c.cfg.Topology == nil:
		return fabric.Cost{Reason: "no topology: device links unknown"}, false
	case !path.PeerToPeer():
		return fabric.Cost{Path: path, Reason: fmt.Sprintf("devices not linked (path %v)", path)}, false
	}
	return fabric.Cost{Path: path, GBps: path.GBps, Reason: fabric.PeerReason(path) + " to another process: the object mapped by descriptor"}, true
}

// Read copies src's bytes from the owner's object into dst. Every read asks
// the owner to re-validate the claim and to pin the object until the copy
// is acknowledged, so a freed or reused object is never read as valid data
// even when its mapping is cached.
func (t *Transport) Read(ctx context.Context, src fabric.Remote, dst tensor.Buffer) (fabric.Stats, error) {
	if t.closed.Load() {
		return fabric.Stats{}, fabric.ErrClosed
	}
	return t.c.read(ctx, t.name, src, dst)
}

// Write pushes dst.Length bytes of src into the sink that dst names, by
// mapping the sink's pages writable and copying into them.
func (t *Transport) Write(ctx context.Context, src tensor.Buffer, dst fabric.Remote) (fabric.Stats, error) {
	if t.closed.Load() {
		return fabric.Stats{}, fabric.ErrClosed
	}
	return t.c.write(ctx, t.name, src, dst, nil)
}

var _ fabric.GatherWriter = (*Transport)(nil)

// WriteRuns pushes the concatenation of runs of src into the sink dst
// names: the sink's pages are mapped writable, as Write maps them, and the
// runs are copied from src straight into them (no packed copy). Host
// memory only; the planner packs device memory.
func (t *Transport) WriteRuns(ctx context.Context, src tensor.Buffer, runs []fabric.Run, dst fabric.Remote) (fabric.Stats, error) {
	if t.closed.Load() {
		return fabric.Stats{}, fabric.ErrClosed
	}
	if _, err := fabric.RunsSource(t.name, src, runs, dst); err != nil {
		return fabric.Stats{}, err
	}
	rs := make([]pcopy.Run, len(runs))
	for i, r := range runs {
		rs[i] = pcopy.Run{Off: r.Off, Len: r.Len}
	}
	return t.c.write(ctx, t.name, src, dst, rs)
}

// Close closes the view; a view made by New or NewP2P also closes its
// client. It is idempotent.
func (t *Transport) Close() error {
	if t.closed.Swap(true) || !t.ownsCli {
		return nil
	}
	return t.c.Close()
}
