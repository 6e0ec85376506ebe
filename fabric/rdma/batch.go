package rdma

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Batches (fabric.BatchReader). Read pays a control round trip per
// object (resolve: the owner pins and registers it) before its first READ
// can be posted. ReadBatch resolves the objects of one owner together, up
// to maxBatch (and batchBudget bytes) per round trip (batchwire.go), and
// moves each chunk's objects as soon as it is resolved, batchParallel at a
// time over the rails, while the next chunk resolves; the registrations
// are released behind it, again many per message. An owner that does not
// know the batch messages refuses them (ErrBadRequest) and the batch is
// read object by object instead.

var _ fabric.BatchReader = (*Transport)(nil)

// batchParallel is how many objects of a batch move at once: enough to keep
// every rail's queue busy with small objects. batchBytes bounds the bytes
// they may have outstanding together: a large object stripes over the
// rails on its own, and sixteen of them at once would only crowd the
// queues (an object above it moves alone).
const (
	batchParallel = 16
	batchBytes    = 64 << 20
)

// ReadBatch pulls srcs[i] into dsts[i] for every i; see fabric.BatchReader.
func (t *Transport) ReadBatch(ctx context.Context, srcs []fabric.Remote, dsts []tensor.Buffer) ([]fabric.Stats, []error) {
	if errs := fabric.CheckBatch(srcs, dsts); errs != nil {
		return make([]fabric.Stats, len(srcs)), errs
	}
	return t.batch(ctx, srcs, dsts, false)
}

// batch moves the items of a read batch (remotes[i] into locals[i]) or a
// write batch (push: locals[i] into the sink remotes[i] names), grouped per
// (owner, local device); the two lists have one length.
func (t *Transport) batch(ctx context.Context, remotes []fabric.Remote, locals []tensor.Buffer, push bool) ([]fabric.Stats, []error) {
	sts := make([]fabric.Stats, len(remotes))
	errs := make([]error, len(remotes))
	type groupKey struct {
		peer, addr string
		dev        tensor.DeviceID
	}
	groups := map[groupKey][]int{}
	var keys []groupKey
	var alone []int
	for i, r := range remotes {
		_, hostErr := tensor.BytesOf(locals[i])
		switch {
		case r.Length < 0 || locals[i].Len() < r.Length:
			side := "destination"
			if push {
				side = "source"
			}
			errs[i] = fmt.Errorf("%w: %s holds %d of %d bytes", tensor.ErrTooSmall, side, locals[i].Len(), r.Length)
		case tensor.IsDevice(locals[i]) || hostErr != nil:
			alone = append(alone, i) // staged through host memory: Read or Write does it
		default:
			k := groupKey{r.Peer, r.Addrs[fabric.RDMA], locals[i].Device()}
			if groups[k] == nil {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], i)
		}
	}
	var wg sync.WaitGroup
	if len(alone) > 0 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for _, i := range alone {
				if err := ctx.Err(); err != nil {
					errs[i] = err
					continue
				}
				sts[i], errs[i] = t.single(ctx, remotes[i], locals[i], push)
			}
		}()
	}
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.batchOwner(ctx, groups[k], remotes, locals, push, sts, errs)
		}()
	}
	wg.Wait()
	return sts, errs
}

// single moves one item of a batch on its own.
func (t *Transport) single(ctx context.Context, remote fabric.Remote, local tensor.Buffer, push bool) (fabric.Stats, error) {
	if push {
		return t.Write(ctx, local, remote)
	}
	return t.Read(ctx, remote, local)
}

// batchOwner moves the items idx, all of one owner and memory of one local
// device: resolved (or, push, their sinks resolved) many per round trip.
func (t *Transport) batchOwner(ctx context.Context, idx []int, remotes []fabric.Remote, locals []tensor.Buffer, push bool, sts []fabric.Stats, errs []error) {
	fail := func(err error, idx []int) {
		for _, i := range idx {
			errs[i] = err
		}
	}
	// Largest first: the small ones fill the gaps the large ones leave.
	idx = slices.Clone(idx)
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(remotes[b].Length, remotes[a].Length) })
	first := remotes[idx[0]]
	rails, _, err := t.railsFor(first, locals[idx[0]].Device())
	if err != nil {
		fail(err, idx)
		return
	}
	remote, _ := ParseAddrs(first.Addrs[fabric.RDMA])
	var total int64
	for _, i := range idx {
		total += remotes[i].Length
	}
	if total > t.cfg.SliceSize {
		// Connect every rail now, so their handshakes overlap the control
		// exchange.
		for _, r := range rails[1:] {
			t.ready(r)
		}
	}

	var (
		mu   sync.Mutex
		done []uint64 // registrations to release
		via  *rail
		viaQ QueuePair
		wg   sync.WaitGroup
		sem  = make(chan struct{}, batchParallel)
		room = semaphore.NewWeighted(batchBytes)
	)
	defer func() {
		wg.Wait()
		if len(done) > 0 {
			t.releaseLater(rails, via, viaQ, done...)
		}
	}()
	replySize := batchReplySize(remote)
	for start := 0; start < len(idx); {
		// The next chunk: as many items as the budget allows.
		var reqs []resolveReq
		reqBytes, repBytes := 0, 0
		end := start
		for ; end < len(idx) && len(reqs) < maxBatch; end++ {
			src := remotes[idx[end]]
			req := resolveReq{id: randomID(), push: push, claim: src.Claim, offset: src.Offset, length: src.Length}
			if len(reqs) > 0 && (reqBytes+batchRequestSize(req) > batchBudget || repBytes+replySize > batchBudget) {
				break
			}
			reqBytes += batchRequestSize(req)
			repBytes += replySize
			reqs = append(reqs, req)
		}
		chunk := idx[start:end]
		start = end
		if err := ctx.Err(); err != nil {
			fail(err, chunk)
			continue
		}
		ids := make([]uint64, len(reqs))
		for k, r := range reqs {
			ids[k] = r.id
		}
		at := time.Now()
		resp, r, qp, err := t.call(ctx, rails, first.Peer, marshalResolveBatch(reqs), ids...)
		var items []batchItem
		if err == nil {
			if items, err = decodeBatchReply(resp, len(reqs)); err != nil {
				t.sendDone(rails, r, qp, ids...)
			}
		}
		if errors.Is(err, fabric.ErrBadRequest) && len(reqs) > 0 {
			// An owner without batches (or one that refused the whole
			// message): object by object.
			t.log.Debug("rdma batch resolve refused; moving one by one", "owner", first.Peer, "push", push, "err", err)
			for _, i := range chunk {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					sts[i], errs[i] = t.single(ctx, remotes[i], locals[i], push)
				}()
			}
			continue
		}
		if err != nil {
			fail(err, chunk)
			continue
		}
		mu.Lock()
		if via == nil {
			via, viaQ = r, qp
		}
		mu.Unlock()
		for k, i := range chunk {
			it := items[k]
			if err := it.err(); err != nil {
				errs[i] = err
				continue
			}
			sess := &session{id: ids[k], rail: r, qp: qp, keys: map[string]regKey{}}
			for _, key := range it.resp.keys {
				sess.keys[key.NIC] = key
			}
			weight := min(max(remotes[i].Length, 1), batchBytes)
			if err := room.Acquire(ctx, weight); err != nil {
				errs[i] = err
				mu.Lock()
				done = append(done, sess.id)
				mu.Unlock()
				continue
			}
			wg.Add(1)
			sem <- struct{}{}
			go func() {
				defer func() { <-sem; room.Release(weight); wg.Done() }()
				p, err := tensor.BytesOf(locals[i])
				if err == nil {
					sts[i], err = t.move(ctx, at, rails, sess, remotes[i], p[:remotes[i].Length], nil, push)
				}
				errs[i] = err
				sts[i].Coalesced = len(idx)
				mu.Lock()
				done = append(done, sess.id)
				mu.Unlock()
			}()
		}
	}
}
