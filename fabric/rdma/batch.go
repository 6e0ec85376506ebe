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
	sts := make([]fabric.Stats, len(srcs))
	if errs := fabric.CheckBatch(srcs, dsts); errs != nil {
		return sts, errs
	}
	errs := make([]error, len(srcs))
	type groupKey struct {
		peer, addr string
		dev        tensor.DeviceID
	}
	groups := map[groupKey][]int{}
	var keys []groupKey
	var alone []int
	for i, src := range srcs {
		_, hostErr := tensor.BytesOf(dsts[i])
		switch {
		case src.Length < 0 || dsts[i].Len() < src.Length:
			errs[i] = fmt.Errorf("%w: destination holds %d of %d bytes", tensor.ErrTooSmall, dsts[i].Len(), src.Length)
		case tensor.IsDevice(dsts[i]) || hostErr != nil:
			alone = append(alone, i) // staged through host memory: Read does it
		default:
			k := groupKey{src.Peer, src.Addrs[fabric.RDMA], dsts[i].Device()}
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
				sts[i], errs[i] = t.Read(ctx, srcs[i], dsts[i])
			}
		}()
	}
	for _, k := range keys {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t.readOwner(ctx, groups[k], srcs, dsts, sts, errs)
		}()
	}
	wg.Wait()
	return sts, errs
}

// readOwner reads the items idx, all of one owner into memory of one
// device.
func (t *Transport) readOwner(ctx context.Context, idx []int, srcs []fabric.Remote, dsts []tensor.Buffer, sts []fabric.Stats, errs []error) {
	fail := func(err error, idx []int) {
		for _, i := range idx {
			errs[i] = err
		}
	}
	// Largest first: the small ones fill the gaps the large ones leave.
	idx = slices.Clone(idx)
	slices.SortStableFunc(idx, func(a, b int) int { return cmp.Compare(srcs[b].Length, srcs[a].Length) })
	first := srcs[idx[0]]
	rails, _, err := t.railsFor(first, dsts[idx[0]].Device())
	if err != nil {
		fail(err, idx)
		return
	}
	remote, _ := ParseAddrs(first.Addrs[fabric.RDMA])
	var total int64
	for _, i := range idx {
		total += srcs[i].Length
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
			src := srcs[idx[end]]
			req := resolveReq{id: randomID(), claim: src.Claim, offset: src.Offset, length: src.Length}
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
			t.log.Debug("rdma batch resolve refused; reading one by one", "owner", first.Peer, "err", err)
			for _, i := range chunk {
				wg.Add(1)
				sem <- struct{}{}
				go func() {
					defer func() { <-sem; wg.Done() }()
					sts[i], errs[i] = t.Read(ctx, srcs[i], dsts[i])
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
			weight := min(max(srcs[i].Length, 1), batchBytes)
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
				p, err := tensor.BytesOf(dsts[i])
				if err == nil {
					sts[i], err = t.move(ctx, at, rails, sess, srcs[i], p[:srcs[i].Length], false)
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
