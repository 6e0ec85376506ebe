package rdt

import (
	"context"
	"fmt"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/wire"
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

// ctlwire.PushBatch is the push notice for many slots of one runtime. Kinds
// 2..15 are left to the broadcast notices (bcastwire.go).
//
//	kind (1) = 16 | incarnation (uvarint) | count (uvarint) |
//	count x (slot (16) | token (bytes) | bytes (uvarint))
//
// The answer is one status byte: 0 when every item was taken, ctlwire.StatusItems
// followed by count status bytes (one per item, in order) when some were
// not, or another status when the notice as a whole was refused (nothing
// taken).
//
// (ctlwire.PushBatch and ctlwire.StatusItems are in noticewire.go's table.)

// maxPushBatch bounds the items of one push batch notice; minPushItem is
// the fewest bytes an item takes, so a count the notice cannot hold is
// refused before anything is allocated for it.
const (
	maxPushBatch = 1024
	minPushItem  = 16 + 1 + 1
	// pushBatchBudget bounds an encoded notice below ctlwire.MaxNotice.
	pushBatchBudget = ctlwire.MaxNotice - 1024
)

// register exports the notice counters: pushes over notices taken is how
// much PushBatch coalesced the control round trips into this runtime.
func (t *sinkTable) register(reg prometheus.Registerer) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tensorlane_push_notices_total",
			Help: "Push notices this runtime took as a slot owner (one per Push, one per destination and PushBatch)."},
			func() float64 { return float64(t.notices.Load()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "tensorlane_push_notice_items_total",
			Help: "Pushes those notices reported: over tensorlane_push_notices_total, how many pushes shared a notice."},
			func() float64 { return float64(t.noticed.Load()) }),
	)
}

// pushBatchNotice is the decoded notice.
type pushBatchNotice struct {
	incarnation uint64
	items       []pushBatchItem
}

type pushBatchItem struct {
	slot  fabric.ObjectID
	token []byte
	bytes int64
}

func (n pushBatchNotice) marshal() []byte {
	e := wire.Encoder{Buf: make([]byte, 0, 16+len(n.items)*48)}
	e.Byte(ctlwire.PushBatch)
	e.Uvarint(n.incarnation)
	e.Uvarint(uint64(len(n.items)))
	for _, it := range n.items {
		e.Fixed(it.slot[:])
		e.Bytes(it.token)
		e.Uvarint(uint64(it.bytes))
	}
	return e.Buf
}

// itemSize is an upper bound of one item's encoded bytes.
func (it pushBatchItem) size() int { return 16 + 10 + len(it.token) + 10 }

func parsePushBatchNotice(p []byte) (pushBatchNotice, error) {
	d := wire.NewDecoder(p)
	var n pushBatchNotice
	if k := d.Byte(); k != ctlwire.PushBatch && d.Err() == nil {
		return n, fmt.Errorf("%w: push batch notice kind %d", ErrMalformedRef, k)
	}
	n.incarnation = d.Uvarint()
	c := d.Count(maxPushBatch)
	if err := d.Err(); err != nil {
		return n, fmt.Errorf("%w: push batch notice: %v", ErrMalformedRef, err)
	}
	if c == 0 || c > d.Remaining()/minPushItem {
		return n, fmt.Errorf("%w: push batch notice of %d items in %d bytes", ErrMalformedRef, c, d.Remaining())
	}
	n.items = make([]pushBatchItem, c)
	for i := range n.items {
		it := &n.items[i]
		d.Fixed(it.slot[:])
		it.token = d.Bytes(ctlwire.MaxToken)
		b := d.Uvarint()
		if b > 1<<62 {
			return n, fmt.Errorf("%w: push batch notice item of %d bytes", ErrMalformedRef, b)
		}
		it.bytes = int64(b)
	}
	if err := d.Finish(); err != nil {
		return n, fmt.Errorf("%w: push batch notice: %v", ErrMalformedRef, err)
	}
	return n, nil
}

// pushedBatch takes the pushes a batch notice reports, each slot on its
// own, and returns each item's error. A slot named twice in one notice is
// taken once: its generation advances once per push.
func (r *Runtime) pushedBatch(from peer.ID, n pushBatchNotice) []error {
	errs := make([]error, len(n.items))
	seen := make(map[fabric.ObjectID]struct{}, len(n.items))
	for i, it := range n.items {
		if _, dup := seen[it.slot]; dup {
			errs[i] = fmt.Errorf("%w: slot %v named twice in one push batch", ErrMalformedRef, it.slot)
			continue
		}
		seen[it.slot] = struct{}{}
		errs[i] = r.pushed(from, pushNotice{slot: it.slot, incarnation: n.incarnation, token: it.token, bytes: it.bytes})
	}
	return errs
}

// answerPushBatch is the reply to a push batch notice.
func answerPushBatch(errs []error) []byte {
	out := make([]byte, 1, 1+len(errs))
	for _, err := range errs {
		if err != nil {
			out[0] = ctlwire.StatusItems
		}
	}
	if out[0] == ctlwire.StatusOK {
		return out
	}
	for _, err := range errs {
		out = append(out, ctlwire.StatusOf(err))
	}
	return out
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
// one notice per destination runtime (per maxPushBatch items).
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
// in as few notices as fit (one for up to maxPushBatch items), and records
// each item's outcome and the notice it shared.
func (r *Runtime) notifyPushBatch(ctx context.Context, o ownerKey, idx []int, dsts []Ref, xs []Transfer, errs []error) {
	for len(idx) > 0 {
		n := pushBatchNotice{incarnation: o.inc}
		size := 32
		k := 0
		for ; k < len(idx) && k < maxPushBatch; k++ {
			d := dsts[idx[k]]
			it := pushBatchItem{slot: d.Object, token: d.Token, bytes: spanBytes(d.Desc)}
			if k > 0 && size+it.size() > pushBatchBudget {
				break
			}
			size += it.size()
			n.items = append(n.items, it)
		}
		part := idx[:k]
		idx = idx[k:]
		var itemErrs []error
		if o.id == r.host.ID() {
			itemErrs = r.pushedBatch(r.host.ID(), n)
		} else {
			r.learnAddrs(dsts[part[0]])
			itemErrs = r.sendPushBatch(ctx, o.id, n)
		}
		for k, i := range part {
			errs[i] = itemErrs[k]
			xs[i].Notified = len(part)
		}
	}
}

// sendPushBatch delivers a push batch notice and returns each item's
// outcome.
func (r *Runtime) sendPushBatch(ctx context.Context, to peer.ID, n pushBatchNotice) []error {
	errs := make([]error, len(n.items))
	fail := func(err error) []error {
		for i := range errs {
			errs[i] = err
		}
		return errs
	}
	status, items, err := r.sendNoticeItems(ctx, to, n.marshal(), len(n.items))
	switch {
	case err != nil:
		return fail(fmt.Errorf("%w: %w", ErrPeerUnreachable, err))
	case status == 0:
		return errs
	case status != ctlwire.StatusItems:
		return fail(ctlwire.ErrOf(status))
	}
	for i, s := range items {
		if s == ctlwire.StatusItems { // not an item's status: the answer is garbled
			errs[i] = fmt.Errorf("%w: push batch answer with status %d for an item", ErrMalformedRef, s)
			continue
		}
		errs[i] = ctlwire.ErrOf(s)
	}
	return errs
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
