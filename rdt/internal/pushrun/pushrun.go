// Package pushrun is rdt's engine of pushes: one (rdt's Push, One) and
// coalesced (rdt's PushBatch, Batch). A
// trainer pushing a state dict into a reader's slots pays, per tensor, a
// write over the path and a push notice round trip on the control channel.
// Batch hands every write to the planner together (tcp pipelines the
// writes of one destination, rdma resolves all its sinks in one round
// trip) and then tells each destination runtime about all its completed
// pushes in one notice (ctlwire.PushBatch), which answers with one status
// per item. A slot's generation advances once per push whose bytes landed
// and whose notice the slot took: an item that failed anywhere leaves its
// slot as it was. What it needs of the runtime is Env.
package pushrun

import (
	"context"
	"fmt"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Env is the runtime as the push engine sees it.
type Env interface {
	// Self is this runtime's peer and incarnation: the owner of every
	// push's source.
	Self() (peer.ID, uint64)
	// Open checks that src's bytes fit dst's slot exactly (with runs: that
	// the runs lie inside src's bytes and fill the slot exactly), pins them
	// and returns the pin (released by the engine), the window of it that
	// moves (with runs: all of src's bytes, which the runs index), and the
	// slot's Remote.
	Open(ctx context.Context, src, dst refwire.Ref, runs []fabric.Run) (pin, win tensor.Buffer, remote fabric.Remote, err error)
	// Endpoint is where this runtime's device dev sits.
	Endpoint(dev tensor.DeviceID) fabric.Endpoint
	// Write moves buf, at ep, into remote over the best path that can
	// push (the planner's).
	Write(ctx context.Context, ep fabric.Endpoint, buf tensor.Buffer, remote fabric.Remote) (fabric.Stats, fabric.Plan, error)
	// WriteRuns moves the runs of buf, concatenated, into remote
	// (fabric.Planner.WriteRuns: gathered where the path can, else packed
	// into staging memory of this runtime, counted).
	WriteRuns(ctx context.Context, ep fabric.Endpoint, buf tensor.Buffer, runs []fabric.Run, remote fabric.Remote) (fabric.Stats, fabric.Plan, error)
	// WriteBatch moves bufs[i] from eps[i] into remotes[i] (the planner's).
	WriteBatch(ctx context.Context, eps []fabric.Endpoint, bufs []tensor.Buffer, remotes []fabric.Remote, parallel int) []fabric.BatchResult
	// Tell delivers a push batch notice to slot runtime to (this one
	// included) and returns each item's condition; about is a slot there,
	// whose addresses reach it.
	Tell(ctx context.Context, to peer.ID, about refwire.Ref, n ctlwire.PushBatchNotice) []error
	// Notify delivers one push's notice to the runtime of slot dst (this
	// one included) and returns its condition.
	Notify(ctx context.Context, dst refwire.Ref, n ctlwire.PushNotice) error
}

// Result is one push's outcome besides its error (rdt.Transfer).
type Result struct {
	Plan  fabric.Plan
	Stats fabric.Stats
	// Notified is how many pushes shared the item's notice.
	Notified int
}

// one is an item on its way: the pinned source, the window of it that
// moves, and the slot's Remote.
type one struct {
	i      int
	pin    tensor.Buffer
	win    tensor.Buffer
	remote fabric.Remote
}

// owner names one life of a slot runtime.
type owner struct {
	id  peer.ID
	inc uint64
}

// Batch pushes srcs[i] into dsts[i] for every i: validated and pinned one
// by one, moved coalesced per (path, destination) by the planner, then one
// notice per destination runtime (per ctlwire.MaxPushBatch items). onItem,
// if set, is told each pushed item's bytes.
func Batch(ctx context.Context, env Env, srcs, dsts []refwire.Ref, parallel int, onItem func(int64)) ([]Result, []error) {
	xs := make([]Result, len(srcs))
	out := make([]error, len(srcs))
	self, inc := env.Self()
	type slotKey struct {
		owner peer.ID
		slot  fabric.ObjectID
	}
	first := map[slotKey]int{}
	var moving []one
	defer func() {
		for _, m := range moving {
			m.pin.Release()
		}
	}()
	for i, src := range srcs {
		dst := dsts[i]
		if src.Owner != self || src.Incarnation != inc {
			out[i] = fmt.Errorf("%w: push source %v is not owned by this runtime", errs.NotOwner, src)
			continue
		}
		k := slotKey{dst.Owner, dst.Object}
		if j, dup := first[k]; dup {
			// Two writes into one slot at once would race; and a push
			// advances its slot's generation once.
			out[i] = fmt.Errorf("%w: slot %v is the destination of items %d and %d of one batch", errs.MalformedRef, dst.Object, j, i)
			continue
		}
		first[k] = i
		pin, win, remote, err := env.Open(ctx, src, dst, nil)
		if err != nil {
			out[i] = err
			continue
		}
		moving = append(moving, one{i: i, pin: pin, win: win, remote: remote})
	}
	eps := make([]fabric.Endpoint, len(moving))
	bufs := make([]tensor.Buffer, len(moving))
	remotes := make([]fabric.Remote, len(moving))
	for k, m := range moving {
		eps[k], bufs[k], remotes[k] = env.Endpoint(srcs[m.i].Device), m.win, m.remote
	}
	res := env.WriteBatch(ctx, eps, bufs, remotes, parallel)
	// The pushes whose bytes landed, per destination runtime.
	landed := map[owner][]int{}
	var owners []owner
	for k, m := range moving {
		xs[m.i] = Result{Plan: res[k].Plan, Stats: res[k].Stats}
		if out[m.i] = res[k].Err; out[m.i] != nil {
			continue
		}
		o := owner{dsts[m.i].Owner, dsts[m.i].Incarnation}
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
			notify(ctx, env, o, landed[o], dsts, xs, out)
		}()
	}
	wg.Wait()
	for i := range srcs {
		if out[i] == nil && onItem != nil {
			onItem(span(srcs[i].Desc))
		}
	}
	return xs, out
}

// notify tells one slot runtime that the pushes idx completed, in as few
// notices as fit (one for up to ctlwire.MaxPushBatch items), and records
// each item's outcome and the notice it shared.
func notify(ctx context.Context, env Env, o owner, idx []int, dsts []refwire.Ref, xs []Result, out []error) {
	for len(idx) > 0 {
		n := ctlwire.PushBatchNotice{Incarnation: o.inc}
		size := 32
		k := 0
		for ; k < len(idx) && k < ctlwire.MaxPushBatch; k++ {
			d := dsts[idx[k]]
			it := ctlwire.PushBatchItem{Slot: d.Object, Token: d.Token, Bytes: span(d.Desc)}
			if k > 0 && size+it.Size() > ctlwire.PushBatchBudget {
				break
			}
			size += it.Size()
			n.Items = append(n.Items, it)
		}
		part := idx[:k]
		idx = idx[k:]
		itemErrs := env.Tell(ctx, o.id, dsts[part[0]], n)
		for k, i := range part {
			out[i] = itemErrs[k]
			xs[i].Notified = len(part)
		}
	}
}

func span(d tensor.Desc) int64 {
	start, end := d.Span()
	return end - start
}
