package rdt

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/rdt/internal/bcastrun"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// The broadcast's control messages ride the push-notice streams
// (rdt/internal/notices); their kinds and status bytes are in ctlwire's table, their
// codec is bcast.Msg. They are small (a few refs at most) and answered
// with one status byte like push notices.

// sendBcast delivers a broadcast notice to runtime to (this one included)
// and returns the condition it was answered with.
func (r *Runtime) sendBcast(ctx context.Context, to peer.ID, m bcastrun.Msg) error {
	if to == r.host.ID() {
		return r.onBcast(to, m)
	}
	p, err := m.Marshal()
	if err != nil {
		return err
	}
	return r.notices.Tell(ctx, to, p)
}

// onBcast handles a broadcast notice from peer from (bcastrun.Handle).
func (r *Runtime) onBcast(from peer.ID, m bcastrun.Msg) error {
	return bcastrun.Handle(r.bcast, r.relays, from, m)
}

// bcastEnv is the runtime as the broadcast engine sees it (bcastrun.Env).
type bcastEnv struct{ r *Runtime }

func (e bcastEnv) Self() (peer.ID, uint64) { return e.r.host.ID(), e.r.incarnation }
func (e bcastEnv) Closed() bool            { return e.r.isClosed() }
func (e bcastEnv) Done() <-chan struct{}   { return e.r.done }
func (e bcastEnv) Send(ctx context.Context, to peer.ID, m bcastrun.Msg) error {
	return e.r.sendBcast(ctx, to, m)
}
func (e bcastEnv) Learn(ref refwire.Ref) { e.r.learnAddrs(Ref(ref)) }

func (e bcastEnv) Watch(id peer.ID, inc uint64) (<-chan struct{}, func()) {
	unuse := e.r.peers.Use(id)
	return e.r.peers.DeathOf(id, inc), unuse
}

// Edge plans the push from memory on dev into dst's slot once (the
// planner's best path that can push) and returns what runs that plan for
// each chunk, with the planner's retries and fallback.
func (e bcastEnv) Edge(dev tensor.DeviceID, dst refwire.Ref) bcastrun.WriteFunc {
	remote := e.r.remoteFor(Ref(dst))
	plan := e.r.planner.PlanWrite(e.r.endpoint(dev), remote)
	return func(ctx context.Context, src tensor.Buffer, off int64) error {
		at, p := remote, plan // run names the transport it used in its copy
		at.Offset, at.Length = off, src.Len()
		_, err := e.r.planner.RunWrite(ctx, &p, src, at)
		return err
	}
}

// EdgePath is the transport a broadcast edge from from's memory into
// slot to would take.
func (e bcastEnv) EdgePath(from, to refwire.Ref) string {
	r := e.r
	parentEp := r.remoteFor(Ref(from)).Endpoint
	child := r.remoteFor(Ref(to))
	if parentEp.Process == child.Endpoint.Process {
		// Both in one other runtime: ask as that runtime would (the
		// local transports serve only their own runtime's pairs).
		parentEp.Process, child.Endpoint.Process = r.process, r.process
	}
	if p := r.planner.PlanWrite(parentEp, child).Chosen; p != "" { // what the relay's push runs
		return p
	}
	return "none"
}
