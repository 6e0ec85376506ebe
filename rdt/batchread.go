package rdt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/batchplan"
	"github.com/tensorlane/tensorlane/tensor"
)

// Coalesced reads. After holdBatch leased a batch's refs (one round trip
// per owner), the refs of each other runtime go to the planner together
// (fabric.Planner.ReadBatch): the items whose path is a
// fabric.BatchReader (tcp, rdma, shm, p2p) move coalesced per (owner, path), the
// others one by one. Each item's Transfer.Stats.Coalesced says how many
// moved together with it.

// ownerKey names one life of another runtime.
type ownerKey struct {
	id  peer.ID
	inc uint64
}

// fetchOwner fetches refs[idx...], all owned by one incarnation of another
// runtime and held already, onto dst, and fills in their items.
func (a *Actor) fetchOwner(ctx context.Context, refs []Ref, idx []int, dst tensor.DeviceID, items []BatchItem, cfg BatchConfig) {
	r := a.rt
	fail := func(err error, idx []int) {
		for _, i := range idx {
			items[i].Err = err
		}
	}
	ctx, end, err := r.beginGet(ctx)
	if err != nil {
		fail(err, idx)
		return
	}
	defer end()
	first := refs[idx[0]]
	unuse := r.peers.Use(first.Owner)
	defer unuse()
	// Each item's Get use of its lease (no round trip: the batch holds it).
	var live []int
	for _, i := range idx {
		if err := r.hold(ctx, "", refs[i]); err != nil {
			items[i].Err = r.why(ctx, refs[i], err)
			continue
		}
		live = append(live, i)
	}
	defer func() {
		for _, i := range live {
			r.unget(refs[i])
		}
	}()
	// One watcher for the owner: its death fails every item still moving.
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	death := r.peers.DeathOf(first.Owner, first.Incarnation)
	watching := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		select {
		case <-death:
			cancel(r.deadErr(first, errors.New("declared dead while a batch waited on it")))
		case <-watching:
		case <-ctx.Done():
		}
	}()
	defer func() { close(watching); wg.Wait() }()

	mem, err := r.Memory(dst)
	if err != nil {
		fail(err, live)
		return
	}
	dstEp := r.endpoint(dst)
	srcs := make([]fabric.Remote, 0, len(live))
	bufs := make([]tensor.Buffer, 0, len(live))
	moving := make([]int, 0, len(live))
	dones := make([]func(Transfer, error), 0, len(live))
	for _, i := range live {
		ref := refs[i]
		done := r.observeRead(a.name, ref, dstEp) // observe.go
		remote := r.remoteFor(ref)
		buf, err := mem.Alloc(ctx, remote.Length)
		if err != nil {
			items[i].Err = r.why(ctx, ref, err)
			done(Transfer{}, items[i].Err)
			continue
		}
		srcs, bufs = append(srcs, remote), append(bufs, buf)
		moving, dones = append(moving, i), append(dones, done)
	}
	res := r.planner.ReadBatch(ctx, srcs, dstEp, bufs, cfg.Parallel)
	for k, i := range moving {
		ref := refs[i]
		x := Transfer{Plan: res[k].Plan, Stats: res[k].Stats}
		err := res[k].Err
		var out tensor.Tensor
		if err == nil {
			out, err = tensor.New(bufs[k], ref.Desc.Rebased())
		}
		if err != nil {
			// The reader never sees a partial tensor.
			bufs[k].Release()
			err = r.why(ctx, ref, err)
			items[i] = BatchItem{Transfer: x, Err: err}
		} else {
			items[i] = BatchItem{Tensor: out, Transfer: x}
			if cfg.onItem != nil {
				cfg.onItem(spanBytes(ref.Desc))
			}
		}
		dones[k](x, err)
	}
}

// BatchPlan says how GetBatch would move a batch onto a device: the refs
// grouped by owner and chosen path, and whether each group moves
// coalesced (one ReadBatch) or object by object.
type BatchPlan struct {
	Groups []BatchGroup `json:"groups"`
	// Refused counts refs no transfer can happen for (malformed, a device
	// the actor may not use, no path); Explain of each says why.
	Refused int `json:"refused,omitempty"`
}

// BatchGroup is the refs of one owner that take one path.
type BatchGroup struct {
	Owner     string `json:"owner"`
	Transport string `json:"transport"`
	Refs      int    `json:"refs"`
	Bytes     int64  `json:"bytes"`
	Coalesced bool   `json:"coalesced"`
	Reason    string `json:"reason"`
}

// String renders the plan one group a line.
func (p BatchPlan) String() string {
	var b strings.Builder
	for i, g := range p.Groups {
		if i > 0 {
			b.WriteByte('\n')
		}
		how := "one by one"
		if g.Coalesced {
			how = "coalesced"
		}
		fmt.Fprintf(&b, "%s via %s: %d refs, %d bytes, %s (%s)", g.Owner, g.Transport, g.Refs, g.Bytes, how, g.Reason)
	}
	if p.Refused > 0 {
		fmt.Fprintf(&b, "\n%d refs refused (Explain each for why)", p.Refused)
	}
	return b.String()
}

// ExplainBatch says how GetBatch of refs onto dst would move them.
func (a *Actor) ExplainBatch(refs []Ref, dst tensor.DeviceID) BatchPlan {
	var g batchGrouper
	for _, ref := range refs {
		plan := a.explain(ref, dst)
		if plan.Err == nil && ref.Owner != a.rt.host.ID() {
			plan = a.rt.planner.PlanRead(a.rt.remoteFor(ref), a.rt.endpoint(dst))
		}
		own := ""
		if ref.Owner == a.rt.host.ID() {
			own = "this runtime's own objects: a view or a local copy each"
		}
		g.Add(shortID(ref.Owner), plan, plan.Coalesces(), own, spanBytes(ref.Desc), "reads", "of one owner")
	}
	return g.done()
}

// batchGrouper builds a BatchPlan one planned item at a time
// (batchplan.Grouper).
type batchGrouper struct{ batchplan.Grouper }

func (g *batchGrouper) done() BatchPlan {
	groups := g.Done()
	out := BatchPlan{Refused: g.Refused}
	for _, b := range groups {
		out.Groups = append(out.Groups, BatchGroup(b))
	}
	return out
}
