package rdt

import (
	"context"
	"errors"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Coalesced reads. After holdBatch leased a batch's refs (one round trip
// per owner), the refs of each other runtime go to the planner together
// (fabric.Planner.ReadBatch): the items whose path is a
// fabric.BatchReader (tcp, rdma) move coalesced per (owner, path), the
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
	unuse := r.peers.use(first.Owner)
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
	death := r.peers.deathOf(first.Owner, first.Incarnation)
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
		done := r.obs.begin(a.name, ref, dstEp) // observe.go
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
