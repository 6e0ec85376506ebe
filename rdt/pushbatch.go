package rdt

import (
	"context"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/batchplan"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/pushrun"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Coalesced pushes: the engine is rdt/internal/pushrun.

// register exports the notice counters: pushes over notices taken is how
// much PushBatch coalesced the control round trips into this runtime.
func registerNotices(reg prometheus.Registerer, t *objstore.Sinks) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tensorlane_push_notices_total",
			Help: "Push notices this runtime took as a slot owner (one per Push, one per destination and PushBatch)."},
			func() float64 { return float64(t.Notices.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tensorlane_push_notice_items_total",
			Help: "Pushes those notices reported: over tensorlane_push_notices_total, how many pushes shared a notice."},
			func() float64 { return float64(t.Noticed.Load()) }),
	)
}

// pushBatch pushes srcs[i] into dsts[i] for every i (pushrun.Batch).
func (a *Actor) pushBatch(ctx context.Context, srcs, dsts []Ref, cfg BatchConfig) ([]Transfer, []error) {
	r := a.rt
	if r.isClosed() {
		errs := make([]error, len(srcs))
		for i := range errs {
			errs[i] = ErrClosed
		}
		return make([]Transfer, len(srcs)), errs
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	res, errs := pushrun.Batch(ctx, pushEnv{r}, wireRefs(srcs), wireRefs(dsts), cfg.Parallel, cfg.onItem)
	xs := make([]Transfer, len(res))
	for i, x := range res {
		xs[i] = Transfer{Plan: planFrom(x.Plan), Stats: x.Stats, Notified: x.Notified}
	}
	return xs, errs
}

// pushEnv is the runtime as the push engine sees it (pushrun.Env).
type pushEnv struct{ r *Runtime }

func (e pushEnv) Self() (peer.ID, uint64) { return e.r.host.ID(), e.r.incarnation }

func (e pushEnv) Open(ctx context.Context, src, dst refwire.Ref, runs []fabric.Run) (tensor.Buffer, tensor.Buffer, fabric.Remote, error) {
	pin, win, remote, err := e.r.openPush(ctx, Ref(src), Ref(dst), runs)
	if err != nil {
		return nil, nil, remote, err
	}
	return pin, win, remote, nil
}

func (e pushEnv) Endpoint(dev tensor.DeviceID) fabric.Endpoint { return e.r.endpoint(dev) }

func (e pushEnv) WriteBatch(ctx context.Context, eps []fabric.Endpoint, bufs []tensor.Buffer, remotes []fabric.Remote, parallel int) []fabric.BatchResult {
	return e.r.planner.WriteBatch(ctx, eps, bufs, remotes, parallel)
}

func (e pushEnv) Write(ctx context.Context, ep fabric.Endpoint, buf tensor.Buffer, remote fabric.Remote) (fabric.Stats, fabric.Plan, error) {
	return e.r.planner.Write(ctx, ep, buf, remote)
}

// WriteRuns stages a pack, for a path that cannot send runs, in memory
// of the source's device (a runtime allocation, which every path can send
// from).
func (e pushEnv) WriteRuns(ctx context.Context, ep fabric.Endpoint, buf tensor.Buffer, runs []fabric.Run, remote fabric.Remote) (fabric.Stats, fabric.Plan, error) {
	return e.r.planner.WriteRuns(ctx, ep, buf, runs, remote, func(ctx context.Context, n int64) (tensor.Buffer, error) {
		mem, err := e.r.Memory(ep.Device)
		if err != nil {
			return nil, err
		}
		return mem.Alloc(ctx, n)
	})
}

func (e pushEnv) Notify(ctx context.Context, dst refwire.Ref, n ctlwire.PushNotice) error {
	if dst.Owner == e.r.host.ID() {
		return e.r.sinks.Pushed(dst.Owner, n)
	}
	e.r.learnAddrs(Ref(dst))
	return e.r.notices.Tell(ctx, dst.Owner, n.Marshal())
}

func (e pushEnv) Tell(ctx context.Context, to peer.ID, about refwire.Ref, n ctlwire.PushBatchNotice) []error {
	if to == e.r.host.ID() {
		return e.r.sinks.PushedBatch(to, n)
	}
	e.r.learnAddrs(Ref(about))
	return e.r.notices.TellBatch(ctx, to, n)
}

// ExplainPushBatch says how PushBatch of srcs into dsts would move them:
// the items grouped by slot runtime (BatchGroup.Owner) and chosen path,
// and whether each group's writes move coalesced. Each group's completed
// pushes are announced in one notice.
func (a *Actor) ExplainPushBatch(srcs, dsts []Ref) BatchPlan {
	r := a.rt
	var g batchplan.Grouper
	for i, dst := range dsts {
		if i >= len(srcs) || srcs[i].Owner != r.host.ID() {
			g.Refused++
			continue
		}
		remote := r.remoteFor(dst)
		remote.Offset, remote.Length = 0, spanBytes(dst.Desc)
		plan := r.planner.PlanWrite(r.endpoint(srcs[i].Device), remote)
		own := ""
		if dst.Owner == r.host.ID() {
			own = "slots of this runtime: a local copy each"
		}
		g.Add(shortID(dst.Owner), plan, plan.CoalescesWrites(), own, remote.Length, "pushes", "to one destination")
	}
	return batchPlan(&g)
}
