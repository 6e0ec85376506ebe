package rdt

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"sync"

	"github.com/libp2p/go-libp2p/core/peer"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/ctlwire"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/refwire"
	"github.com/tensorlane/tensorlane/tensor"
)

// Batches: a state dict is hundreds of tensors. GetBatch takes the holds on
// all of them with one lease round trip per owner (not one per tensor), then
// hands each owner's refs to the planner together, which coalesces the
// transfers per path (tcp pipelines them, rdma registers them all in one
// round trip; batchread.go) and moves the rest a few at a time; the runtime
// renews all the leases in one request per owner as it does every lease. Each item reports its own outcome: a batch that
// mixes valid and freed refs gets the valid tensors and, for the others, why.

// BatchConfig tunes a batch; the zero value means the defaults.
type BatchConfig struct {
	// Parallel is how many transfers run at once (those a path does not
	// coalesce). Default 4.
	Parallel int
	// Separate moves every object on its own, Parallel at a time, as if no
	// path could coalesce: for comparisons (bench statedict).
	Separate bool

	onItem func(bytes int64) // progress (async.go)
}

// BatchItem is one ref's outcome in a batch.
type BatchItem struct {
	Tensor   tensor.Tensor // valid when Err is nil; release it when done
	Transfer Transfer
	Err      error
}

// GetBatch fetches every ref onto dst. The error is non-nil only when the
// batch as a whole could not run (runtime closed, device not the actor's,
// ctx done before it began); per-ref failures are in the items.
func (a *Actor) GetBatch(ctx context.Context, refs []Ref, dst tensor.DeviceID, cfg BatchConfig) ([]BatchItem, error) {
	if a.rt.isClosed() {
		return nil, ErrClosed
	}
	if err := a.mayUse(dst); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 4
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	items := make([]BatchItem, len(refs))
	held := a.rt.holdBatch(ctx, a.name, refs)
	// Another runtime's refs move per owner, coalesced per path where the
	// path can (batchread.go); this runtime's own go one by one (a view on
	// their own device, a local copy otherwise).
	owners := map[ownerKey][]int{}
	var keys []ownerKey
	order := make([]int, 0, len(refs))
	for i, err := range held {
		if err != nil {
			items[i].Err = err
			continue
		}
		if ref := refs[i]; ref.Owner != a.rt.host.ID() && !cfg.Separate {
			k := ownerKey{ref.Owner, ref.Incarnation}
			if owners[k] == nil {
				keys = append(keys, k)
			}
			owners[k] = append(owners[k], i)
			continue
		}
		order = append(order, i)
	}
	var wg sync.WaitGroup
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			a.fetchOwner(ctx, refs, owners[k], dst, items, cfg)
		}()
	}
	sort.SliceStable(order, func(x, y int) bool { return spanBytes(refs[order[x]].Desc) > spanBytes(refs[order[y]].Desc) })
	sem := make(chan struct{}, cfg.Parallel)
	for _, i := range order {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			t, x, err := a.Fetch(ctx, refs[i], dst)
			items[i] = BatchItem{Tensor: t, Transfer: x, Err: err}
			if err == nil && cfg.onItem != nil {
				cfg.onItem(spanBytes(refs[i].Desc))
			}
		}()
	}
	wg.Wait()
	return items, nil
}

// ReleaseBatch releases the tensors of a batch's items that have one.
func ReleaseBatch(items []BatchItem) {
	for _, it := range items {
		if it.Err == nil && it.Tensor.Valid() {
			it.Tensor.Release()
		}
	}
}

// HoldBatch is Hold for many refs at once: one lease request per owner
// (per ctlwire.MaxClaims refs) for the refs this runtime does not hold yet, where
// Hold asks once per ref. errs[i] is ref i's outcome; a held ref is
// Released as after Hold. A batch of Views (the C ABI's ViewBatch) holds
// its refs with it first, so each View's own lease costs no round trip.
func (a *Actor) HoldBatch(ctx context.Context, refs []Ref) []error {
	if a.rt.isClosed() {
		errs := make([]error, len(refs))
		for i := range errs {
			errs[i] = ErrClosed
		}
		return errs
	}
	ctx, cancel := a.rt.bounded(ctx)
	defer cancel()
	return a.rt.holdBatch(ctx, a.name, refs)
}

// holdBatch makes actor a holder of every ref, with one lease request per
// owner (per ctlwire.MaxClaims refs) for those this runtime does not hold yet. It
// returns each ref's error.
func (r *Runtime) holdBatch(ctx context.Context, actor string, refs []Ref) []error {
	errs := make([]error, len(refs))
	type owner struct {
		id  peer.ID
		inc uint64
	}
	groups := map[owner][]int{}
	for i, ref := range refs {
		if err := ref.Desc.Validate(); err != nil {
			errs[i] = fmt.Errorf("%w: %v", ErrMalformedRef, err)
			continue
		}
		if ref.Owner == r.host.ID() {
			if ref.Incarnation != r.incarnation {
				errs[i] = ErrStaleRef
			}
			continue
		}
		if r.leases.Held(keyOf(ref)) {
			continue // held already: the Get's own hold checks and joins it
		}
		k := owner{ref.Owner, ref.Incarnation}
		groups[k] = append(groups[k], i)
	}
	var wg sync.WaitGroup
	for _, idx := range groups {
		wg.Add(1)
		go func() {
			defer wg.Done()
			r.holdGroup(ctx, actor, refs, idx, errs)
		}()
	}
	wg.Wait()
	return errs
}

// holdGroup leases refs[idx...], all of one owner incarnation.
func (r *Runtime) holdGroup(ctx context.Context, actor string, refs []Ref, idx []int, errs []error) {
	first := refs[idx[0]]
	if r.peers.IsDead(first.Owner, first.Incarnation) {
		for _, i := range idx {
			errs[i] = r.deadErr(refs[i], errors.New("declared dead earlier"))
		}
		return
	}
	r.learnAddrs(first)
	// The death watch of a Get (guard) for the batch's lease request: a
	// hung owner never answers it, and only the heartbeats' verdict ends
	// it in time (a frozen owner never reached says OwnerDied, not the
	// dial's PeerUnreachable at its own deadline: probe.go).
	if _, other := r.peers.Replaced(first.Owner, first.Incarnation); !other {
		defer r.peers.Use(first.Owner)()
		var cancel context.CancelCauseFunc
		ctx, cancel = context.WithCancelCause(ctx)
		defer cancel(nil)
		death := r.peers.DeathOf(first.Owner, first.Incarnation)
		done := make(chan struct{})
		defer close(done)
		go func() {
			select {
			case <-death:
				cancel(r.deathVerdict(ctx, first, "a batch's lease request waited on it"))
			case <-done:
			case <-ctx.Done():
			}
		}()
	}
	for start := 0; start < len(idx); start += ctlwire.MaxClaims {
		part := idx[start:min(start+ctlwire.MaxClaims, len(idx))]
		claims := make([]fabric.Claim, len(part))
		layouts := make([]objstore.LayoutSum, len(part))
		for k, i := range part {
			claims[k] = fabric.Claim{Object: refs[i].Object, Incarnation: refs[i].Incarnation, Token: refs[i].Token}
			layouts[k] = objstore.LayoutOf(refs[i].Desc)
		}
		inc, es, err := r.leaseRemote(ctx, first.Owner, ctlwire.LifeLease, claims, layouts)
		cause := context.Cause(ctx)
		frozen := cause == nil && r.frozenOwner(ctx, first, err)
		for k, i := range part {
			ref := refs[i]
			switch {
			case err != nil && cause != nil && (errors.Is(cause, ErrOwnerDied) || errors.Is(cause, ErrPeerUnreachable) || errors.Is(cause, ErrStaleRef)):
				errs[i] = fmt.Errorf("%w (lease request: %v)", cause, err)
			case frozen:
				errs[i] = r.frozenErr(ref, err)
			case err != nil && errors.Is(err, ErrPeerUnreachable) && r.peers.IsDead(ref.Owner, ref.Incarnation):
				errs[i] = r.ownerDiedErr(ref, err)
			case err != nil:
				errs[i] = err
			case inc != ref.Incarnation:
				errs[i] = fmt.Errorf("%w: %v: owner restarted (incarnation %x, ref names %x)", ErrStaleRef, ref, inc, ref.Incarnation)
			case es[k] != nil:
				errs[i] = fmt.Errorf("%v: %w", ref, es[k])
			default:
				errs[i] = r.leases.Add(actor, refwire.Ref(ref), objstore.LayoutOf(ref.Desc))
			}
		}
	}
}

// PushBatch pushes srcs[i] into the slot dsts[i] names for every i and
// returns each push's outcome. The writes move coalesced per (path,
// destination runtime) where the path can (tcp, rdma; Transfer.Stats.Coalesced
// says how many moved together), the rest Parallel at a time, and each
// destination runtime hears of all its completed pushes in one notice
// (Transfer.Notified; pushbatch.go). A slot named twice, a source this
// runtime does not own, or a size mismatch fails that item alone; a failed
// item does not advance its slot's generation. cfg.Separate pushes every
// item on its own with Push instead, for comparisons.
func (a *Actor) PushBatch(ctx context.Context, srcs, dsts []Ref, cfg BatchConfig) ([]Transfer, []error) {
	xs := make([]Transfer, len(srcs))
	errs := make([]error, len(srcs))
	if len(srcs) != len(dsts) {
		for i := range errs {
			errs[i] = fmt.Errorf("%w: %d sources for %d slots", ErrMalformedRef, len(srcs), len(dsts))
		}
		return xs, errs
	}
	if cfg.Parallel <= 0 {
		cfg.Parallel = 4
	}
	if !cfg.Separate {
		return a.pushBatch(ctx, srcs, dsts, cfg)
	}
	sem := make(chan struct{}, cfg.Parallel)
	var wg sync.WaitGroup
	for i := range srcs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer func() { <-sem; wg.Done() }()
			xs[i], errs[i] = a.Push(ctx, srcs[i], dsts[i])
		}()
	}
	wg.Wait()
	return xs, errs
}
