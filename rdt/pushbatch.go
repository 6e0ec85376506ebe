package rdt

import (
	"context"
	"fmt"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/tensor"
)

// Coalesced pushes. A trainer pushing a state dict into a reader's slots
// pays, per tensor, a write over the path and a push notice round trip on
// the control channel. PushBatch hands every write to the planner together
// (fabric.Planner.WriteBatch: tcp pipelines the writes of one destination,
// rdma resolves all its sinks in one round trip) and then tells each
// destination runtime about all its completed pushes in one notice
// (ctlwire.PushBatch), which answers with one status per item. A slot's
// generation advances once per push whose bytes landed and whose notice
// the slot took: an item that failed anywhere leaves its slot as it was.

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

// pushOne is one item of a push batch on its way: the pinned source, the
// window of it that moves, and the slot's Remote.
type pushOne struct {
	i      int
	pin    tensor.Buffer
	src    *objstore.Window
	remote fabric.Remote
}

// pushBatch pushes srcs[i] into dsts[i] for every i: validated and pinned
// one by one, moved coalesced per (path, destination) by the planner, then
// one notice per destination runtime (per ctlwire.MaxPushBatch items).
func (a *Actor) pushBatch(ctx context.Context, srcs, dsts []Ref, cfg BatchConfig) ([]Transfer, []error) {
	r := a.rt
	xs := make([]Transfer, len(srcs))
	errs := make([]error, len(srcs))
	if r.isClosed() {
		for i := range errs {
			errs[i] = ErrClosed
		}
		return xs, errs
	}
	ctx, cancel := r.bounded(ctx)
	defer cancel()
	type slotKey struct {
		owner peer.ID
		slot  fabric.ObjectID
	}
	first := map[slotKey]int{}
	var moving []pushOne
	defer func() {
		for _, m := range moving {
			m.pin.Release()
		}
	}()
	for i, src := range srcs {
		dst := dsts[i]
		if src.Owner != r.host.ID() || src.Incarnation != r.incarnation {
			errs[i] = fmt.Errorf("%w: push source %v is not owned by this runtime", ErrNotOwner, src)
			continue
		}
		k := slotKey{dst.Owner, dst.Object}
		if j, dup := first[k]; dup {
			// Two writes into one slot at once would race; and a push
			// advances its slot's generation once.
			errs[i] = fmt.Errorf("%w: slot %v is the destination of items %d and %d of one batch", ErrMalformedRef, dst.Object, j, i)
			continue
		}
		first[k] = i
		pin, win, remote, err := r.openPush(ctx, src, dst)
		if err != nil {
			errs[i] = err
			continue
		}
		moving = append(moving, pushOne{i: i, pin: pin, src: win, remote: remote})
	}
	eps := make([]fabric.Endpoint, len(moving))
	bufs := make([]tensor.Buffer, len(moving))
	remotes := make([]fabric.Remote, len(moving))
	for k, m := range moving {
		eps[k], bufs[k], remotes[k] = r.endpoint(srcs[m.i].Device), m.src, m.remote
	}
	res := r.planner.WriteBatch(ctx, eps, bufs, remotes, cfg.Parallel)
	// The pushes whose bytes landed, per destination runtime.
	landed := map[ownerKey][]int{}
	var owners []ownerKey
	for k, m := range moving {
		xs[m.i] = Transfer{Plan: res[k].Plan, Stats: res[k].Stats}
		if errs[m.i] = res[k].Err; errs[m.i] != nil {
			continue
		}
		dst := dsts[m.i]
		o := ownerKey{dst.Owner, dst.Incarnation}
		if landed[o] == nil {
			owners = append(owners, o)
		}
		landed[o] = append(landed[o], m.i)
	}
	var wg sync.WaitGroup
	for _, o := range owners {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.notifyPushBatch(ctx, o, landed[o], dsts, xs, errs)
		}()
	}
	wg.Wait()
	for i := range srcs {
		if errs[i] == nil && cfg.onItem != nil {
			cfg.onItem(spanBytes(srcs[i].Desc))
		}
	}
	return xs, errs
}

// notifyPushBatch tells one slot runtime that the pushes idx completed,
// in as few notices as fit (one for up to ctlwire.MaxPushBatch items), and records
// each item's outcome and the notice it shared.
func (r *Runtime) notifyPushBatch(ctx context.Context, o ownerKey, idx []int, dsts []Ref, xs []Transfer, errs []error) {
	for len(idx) > 0 {
		n := ctlwire.PushBatchNotice{Incarnation: o.inc}
		size := 32
		k := 0
		for ; k < len(idx) && k < ctlwire.MaxPushBatch; k++ {
			d := dsts[idx[k]]
			it := ctlwire.PushBatchItem{Slot: d.Object, Token: d.Token, Bytes: spanBytes(d.Desc)}
			if k > 0 && size+it.Size() > ctlwire.PushBatchBudget {
				break
			}
			size += it.Size()
			n.Items = append(n.Items, it)
		}
		part := idx[:k]
		idx = idx[k:]
		var itemErrs []error
		if o.id == r.host.ID() {
			itemErrs = r.sinks.PushedBatch(r.host.ID(), n)
		} else {
			r.learnAddrs(dsts[part[0]])
			itemErrs = r.notices.TellBatch(ctx, o.id, n)
		}
		for k, i := range part {
			errs[i] = itemErrs[k]
			xs[i].Notified = len(part)
		}
	}
}

// ExplainPushBatch says how PushBatch of srcs into dsts would move them:
// the items grouped by slot runtime (BatchGroup.Owner) and chosen path,
// and whether each group's writes move coalesced. Each group's completed
// pushes are announced in one notice.
func (a *Actor) ExplainPushBatch(srcs, dsts []Ref) BatchPlan {
	r := a.rt
	var g batchGrouper
	for i, dst := range dsts {
		if i >= len(srcs) || srcs[i].Owner != r.host.ID() {
			g.out.Refused++
			continue
		}
		remote := r.remoteFor(dst)
		remote.Offset, remote.Length = 0, spanBytes(dst.Desc)
		plan := r.planner.PlanWrite(r.endpoint(srcs[i].Device), remote)
		own := ""
		if dst.Owner == r.host.ID() {
			own = "slots of this runtime: a local copy each"
		}
		g.add(shortID(dst.Owner), plan, plan.CoalescesWrites(), own, remote.Length, "pushes", "to one destination")
	}
	return g.done()
}
