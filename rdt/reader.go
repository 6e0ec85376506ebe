package rdt

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlhost"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/peers"
	"github.com/tensorlane/tensorlane/rdt/internal/reader"
	"github.com/tensorlane/tensorlane/tensor"
)

// The read side (Get, GetInto, GetBatch, View, Hold and the async
// handles) is the engine rdt/internal/reader; readEnv is what it asks of
// the runtime.

func (r *Runtime) newReader() *reader.Reader {
	return reader.New(reader.Deps{Env: readEnv{r}, Planner: r.planner, Peers: r.peers, Leases: r.leases,
		Log: r.log, OwnerDied: r.lifeMetrics.OwnerDied, PingWait: r.cfg.HeartbeatInterval})
}

// readEnv is the runtime as its reads see it (reader.Env).
type readEnv struct{ r *Runtime }

var _ reader.Env = readEnv{}

func (e readEnv) Self() (peer.ID, uint64) { return e.r.host.ID(), e.r.incarnation }
func (e readEnv) Closed() bool            { return e.r.isClosed() }
func (e readEnv) Learn(ref reader.Ref)    { e.r.learnAddrs(Ref(ref)) }

func (e readEnv) Lease(ctx context.Context, owner peer.ID, claims []fabric.Claim, layouts []ctlwire.Layout) (uint64, []error, error) {
	return e.r.leaseRemote(ctx, owner, ctlwire.LifeLease, claims, layouts)
}

func (e readEnv) Ping(ctx context.Context, owner peer.ID) (uint64, error) {
	ctlhost.ClearBackoff(e.r.host, owner)
	reply, err := e.r.call(ctx, owner, ctlwire.LifeMsg{Kind: ctlwire.LifePing})
	return reply.Incarnation, err
}

func (e readEnv) Confirm(ref reader.Ref) error {
	return e.r.objects.Confirm(fabric.Claim{Object: ref.Object, Incarnation: ref.Incarnation, Token: ref.Token}, objstore.LayoutOf(ref.Desc))
}

func (e readEnv) Memory(dev tensor.DeviceID) (tensor.Memory, error) { return e.r.Memory(dev) }
func (e readEnv) Endpoint(dev tensor.DeviceID) fabric.Endpoint      { return e.r.endpoint(dev) }

func (e readEnv) Observe(actor string, ref reader.Ref, dst fabric.Endpoint) func(reader.Result, error) {
	done := e.r.observeRead(actor, Ref(ref), dst) // observe.go
	return func(x reader.Result, err error) { done(x.Plan, x.Stats, err) }
}

func (e readEnv) Probe(ctx context.Context, addrs []string) peers.ProbeOutcome {
	return peers.Probe(ctx, addrs, peers.ProbeWait)
}

// transfer is a read's result as rdt reports it.
func transfer(x reader.Result) Transfer { return Transfer{Plan: planFrom(x.Plan), Stats: x.Stats} }

// who is the actor as its reads name it.
func (a *Actor) who() reader.Actor { return reader.Actor{Name: a.name, Devices: a.devices} }
