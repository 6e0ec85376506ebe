package bcastrun

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// run drives one broadcast to its end.
func (b *Run) run(ctx context.Context) {
	ectx, ecancel := context.WithCancelCause(ctx)
	defer func() {
		ecancel(nil)
		b.edges.Wait()
		b.abortPending()
	}()

	// 1. Prepare every slot (one round trip per reader, concurrently).
	b.parallel(func(i int, n *node) {
		n.err = b.prepare(ectx, n)
		if n.err != nil {
			n.State = bcast.Failed
		}
	})
	// 2. Plan the tree among the readers that are ready.
	var live []int
	var liveRefs []Ref
	for i, n := range b.nodes {
		if n.State == bcast.Pending {
			live = append(live, i)
			liveRefs = append(liveRefs, n.ref)
		}
	}
	sub := b.o.Plan(b.srcs[0].ref, liveRefs)
	b.plan = bcast.Plan{Owner: sub.Owner, Nodes: make([]bcast.Node, len(b.nodes))}
	for i := range b.nodes {
		b.plan.Nodes[i] = bcast.Node{Endpoint: b.nodes[i].ref.Host + "/" + b.nodes[i].ref.Device.String(), Parent: -1, Path: "none (not ready)"}
	}
	for k, i := range live {
		pn := sub.Nodes[k]
		if pn.Parent >= 0 {
			pn.Parent = live[pn.Parent]
		}
		b.plan.Nodes[i] = pn
		b.tree.Plant(i, pn.Parent)
	}
	// 3. Tell the forwarding readers their children.
	b.parallel(func(i int, n *node) {
		if n.State != bcast.Pending || len(n.Children) == 0 {
			return
		}
		for _, m := range b.childrenMsgs(n, n.Children) {
			if err := b.env.Send(ectx, n.ref.Owner, m); err != nil {
				b.post(event{node: i, kind: evEdgeFailed, err: err})
				return
			}
		}
	})
	// Readers are watched: a dead one is routed around.
	self, _ := b.env.Self()
	watched := map[peer.ID]bool{}
	for i, n := range b.nodes {
		if n.State != bcast.Pending || n.ref.Owner == self || watched[n.ref.Owner] {
			continue
		}
		watched[n.ref.Owner] = true
		death, unuse := b.env.Watch(n.ref.Owner, n.ref.Incarnation)
		b.edges.Add(1)
		go func(id peer.ID, i int) {
			defer b.edges.Done()
			defer unuse()
			select {
			case <-death:
				for j, m := range b.nodes {
					if m.ref.Owner == id {
						b.post(event{node: j, kind: evDied, err: fmt.Errorf("%w: %s", errs.ReaderDied, refwire.ShortID(id))})
					}
				}
			case <-ectx.Done():
			}
		}(n.ref.Owner, i)
	}
	// 4. Feed the owner's children.
	for i, n := range b.nodes {
		if n.State == bcast.Pending && n.Parent == -1 {
			b.feed(ectx, i, false)
		}
	}
	// 5. Follow reports until every reader is done or failed.
	for {
		for _, ev := range b.take() {
			b.handle(ectx, ev)
		}
		if b.tree.Finished() {
			return
		}
		select {
		case <-b.kick:
		case <-ctx.Done():
			for _, ev := range b.take() {
				b.handle(ectx, ev)
			}
			return
		}
	}
}

func (b *Run) parallel(f func(i int, n *node)) {
	sem := make(chan struct{}, 16)
	var wg sync.WaitGroup
	for i, n := range b.nodes {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			f(i, n)
		}()
	}
	wg.Wait()
}

// childrenMsgs tells reader n to forward to children: one notice for all
// of them, or, in a batch, one per child with its slot per object.
func (b *Run) childrenMsgs(n *node, children []int) []Msg {
	m := Msg{Kind: ctlwire.Children, ID: b.id, Slot: n.ref.Object, Inc: n.ref.Incarnation, Token: n.ref.Token}
	if len(b.srcs) == 1 {
		for _, c := range children {
			m.Children = append(m.Children, b.nodes[c].ref)
		}
		return []Msg{m}
	}
	var out []Msg
	for _, c := range children {
		cm := m
		cn := b.nodes[c]
		cm.Children = []Ref{cn.ref}
		for k, it := range cn.items {
			cm.Items = append(cm.Items, bcast.Item{Slot: it.Object, Token: it.Token, DType: b.srcs[k].ref.Desc.DType})
		}
		out = append(out, cm)
	}
	return out
}

// prepare readies a reader's slot, waiting up to BusyWait for a
// flow-controlled one whose reader is still consuming.
func (b *Run) prepare(ctx context.Context, n *node) error {
	self, inc := b.env.Self()
	if n.ref.Owner != self {
		b.env.Learn(n.ref)
	}
	msg := Msg{Kind: ctlwire.Prepare, ID: b.id, Slot: n.ref.Object, Inc: n.ref.Incarnation, Token: n.ref.Token,
		N: b.srcs[0].total, Off: b.cfg.ChunkSize, Gen: uint64(b.cfg.Window), OriginInc: inc}
	for k, it := range n.items {
		if err := it.Desc.Validate(); err != nil {
			return fmt.Errorf("%w: slot %d: %v", errs.MalformedRef, k, err)
		}
		if spanBytes(it.Desc) != b.srcs[k].total {
			return fmt.Errorf("%w: slot %d of %d bytes for an object of %d", tensor.ErrTooSmall, k, spanBytes(it.Desc), b.srcs[k].total)
		}
		// The reader's slots are written as one stream to one runtime,
		// addressed as its first slot is.
		if it.Owner != n.ref.Owner || it.Incarnation != n.ref.Incarnation || it.Host != n.ref.Host || it.Device != n.ref.Device {
			return fmt.Errorf("%w: slot %d is on %s/%s, the reader's first on %s/%s (one runtime and device a reader)", errs.MalformedRef, k, it.Host, it.Device, n.ref.Host, n.ref.Device)
		}
		if len(b.srcs) > 1 {
			msg.Items = append(msg.Items, bcast.Item{Slot: it.Object, Token: it.Token, N: b.srcs[k].total})
		}
	}
	wait := time.NewTimer(b.cfg.BusyWait)
	defer wait.Stop()
	for {
		_, changed := b.o.Gens.State(Key{n.ref.Owner, n.ref.Object})
		err := b.env.Send(ctx, n.ref.Owner, msg)
		if !errors.Is(err, errs.SlotBusy) {
			return err
		}
		select {
		case <-changed: // a reader said Done: try again
		case <-wait.C:
			return err
		case <-ctx.Done():
			return err
		}
	}
}

// feed makes the owner write every chunk of every object to reader i,
// Window chunks in flight; a re-parented reader is asked before each
// chunk whether it lacks it (probe).
func (b *Run) feed(ctx context.Context, i int, probe bool) {
	n := b.nodes[i]
	b.tree.Feed(i)
	b.edges.Add(1)
	go func() {
		defer b.edges.Done()
		w := bcast.NewWindow(ctx, b.cfg.Window)
	objects:
		for k, src := range b.srcs {
			write := b.env.Edge(src.pin.Device(), n.items[k])
			for off := int64(0); off < src.total || off == 0; off += b.cfg.ChunkSize {
				off, m := off, min(b.cfg.ChunkSize, src.total-off)
				started := w.Send(func(ctx context.Context) error {
					if err := WriteChunk(ctx, b.env, write, b.id, &objstore.Window{Buffer: src.pin, Off: src.start + off, N: m}, n.items[k], off, probe); err != nil {
						return err
					}
					b.done.Add(m)
					return nil
				})
				if !started {
					break objects
				}
				if src.total == 0 {
					break
				}
			}
		}
		if _, err := w.Wait(); err != nil && ctx.Err() == nil {
			b.post(event{node: i, kind: evEdgeFailed, err: err})
		}
	}()
}

// handle applies one event: completions, failed forwards and failed or
// dead readers (their orphans are re-parented), refused re-parents.
func (b *Run) handle(ctx context.Context, ev event) {
	n := b.nodes[ev.node]
	switch {
	case ev.kind == ctlwire.Report && ev.failed < 0:
		if n.State == bcast.Pending {
			n.State, n.gen, n.gens = bcast.Complete, ev.gen, ev.gens
			if !n.Direct {
				b.done.Add(b.total)
			}
		}
	case ev.kind == ctlwire.Report: // reader ev.node could not feed its child
		if b.tree.Orphaned(ev.failed, ev.node) {
			b.o.d.Log.Info("broadcast routes around a failed forward", "reader", ev.failed, "from", ev.node, "err", ev.err)
			b.reparent(ctx, ev.failed, ev.node)
		}
	case ev.kind == evRefused: // ev.failed did not take orphan ev.node
		if b.tree.Orphaned(ev.node, ev.failed) {
			b.o.d.Log.Info("broadcast re-parent refused", "reader", ev.node, "by", ev.failed, "err", ev.err)
			b.reparent(ctx, ev.node, ev.failed)
		}
	default: // the owner's edge to it failed, or it died
		if n.State != bcast.Pending {
			return
		}
		failed := []int{ev.node}
		// A reader whose runtime refuses the push because it is shutting
		// down has left, whether or not its death notice came first.
		if ev.kind == evEdgeFailed && errors.Is(ev.err, fabric.ErrOwnerClosed) && !b.env.Closed() {
			ev.kind, ev.err = evDied, fmt.Errorf("%w: %s is shutting down: %w", errs.ReaderDied, refwire.ShortID(n.ref.Owner), ev.err)
		}
		if ev.kind == evDied {
			b.o.Gens.Forget(n.ref.Owner)
			// Every reader of the dead runtime fails before any orphan is
			// placed, so none is placed under a dead reader.
			for j, m := range b.nodes {
				if j != ev.node && m.State == bcast.Pending && m.ref.Owner == n.ref.Owner {
					m.State, m.err = bcast.Failed, ev.err
					failed = append(failed, j)
				}
			}
		}
		n.State, n.err = bcast.Failed, ev.err
		for _, f := range failed {
			for _, c := range b.nodes[f].Children {
				if b.tree.Orphaned(c, f) {
					b.reparent(ctx, c, f)
				}
			}
		}
	}
}

// reparent finds orphan c (whose feeder from failed it) a new feeder: the
// nearest live planned ancestor of from, which has the chunks or is getting them
// and forwards what it has at once (its relay stays open until the
// broadcast ends), else the owner. Its own subtree follows it unchanged:
// the new feeder asks before each chunk whether the orphan lacks it (a
// probe notice, overlapped by the window), so the chunks it already had
// cross neither the new edge nor, being no news to it, its subtree.
func (b *Run) reparent(ctx context.Context, c, from int) {
	b.o.d.Metrics.Reroutes.Inc()
	p := b.tree.Reparent(c, from)
	if p < 0 {
		b.o.d.Log.Info("broadcast re-parents an orphan to the owner", "reader", c, "was", from)
		b.feed(ctx, c, true)
		return
	}
	pn := b.nodes[p]
	b.o.d.Log.Info("broadcast re-parents an orphan", "reader", c, "was", from, "now", p)
	b.edges.Add(1)
	go func() {
		defer b.edges.Done()
		m := b.childrenMsgs(pn, []int{c})[0]
		m.Gen = 1 // re-parented: its new feeder asks before each chunk
		err := b.env.Send(ctx, pn.ref.Owner, m)
		if err != nil && ctx.Err() == nil {
			b.post(event{node: c, kind: evRefused, failed: p, err: err})
		}
	}()
}

// abortPending tells readers still waiting that the broadcast is over, so
// their slots are released now rather than at their timeout, and readers
// that forward that their relays may close.
func (b *Run) abortPending() {
	if b.env.Closed() {
		return
	}
	var wg sync.WaitGroup
	for _, n := range b.nodes {
		text := "the owner gave up"
		switch {
		case n.State == bcast.Complete && len(n.Children) > 0:
			text = "over" // it forwards: its relay stays open for orphans until now
		case n.State == bcast.Complete || isReaderGone(n.err):
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), b.o.d.AbortWait)
			defer cancel()
			b.env.Send(ctx, n.ref.Owner, Msg{Kind: ctlwire.Abort, ID: b.id, Slot: n.ref.Object, Inc: n.ref.Incarnation, Token: n.ref.Token, Text: text})
		}()
	}
	wg.Wait()
}

func isReaderGone(err error) bool {
	return err != nil && (errors.Is(err, errs.ReaderDied) || errors.Is(err, errs.ObjectNotFound) || errors.Is(err, errs.StaleRef))
}

func spanBytes(d tensor.Desc) int64 {
	start, end := d.Span()
	return end - start
}
