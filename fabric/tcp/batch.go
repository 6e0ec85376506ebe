package tcp

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Batches (fabric.BatchReader). The requests for many objects of one
// owner go out back to back on a few connections ("lanes"), without
// waiting for the answers, and the answers stream back in order: the
// server already serves a connection's requests one after another, so
// pipelining needs no new frame, and a batch of small objects pays one
// round trip per lane instead of one per object. A refused item (freed,
// unknown, forged) is answered with its status and the lane stays in
// step; an item whose data breaks the connection (corrupt, owner gone)
// fails, and the items queued behind it on that lane fail with
// fabric.ErrPeerClosed, which the planner retries on their own. Objects
// large enough to be striped (2 x StripeMin and up) and device
// destinations are read with Read, beside the lanes.

var _ fabric.BatchReader = (*Transport)(nil)

// laneBytes is the least a lane should carry: a batch of a few small
// objects uses one connection, not Streams of them.
const laneBytes = 1 << 20

// writeRequests is how many pipelined requests go out in one write.
const writeRequests = 64

// ReadBatch pulls srcs[i] into dsts[i] for every i; see fabric.BatchReader.
func (t *Transport) ReadBatch(ctx context.Context, srcs []fabric.Remote, dsts []tensor.Buffer) ([]fabric.Stats, []error) {
	sts := make([]fabric.Stats, len(srcs))
	if errs := fabric.CheckBatch(srcs, dsts); errs != nil {
		return sts, errs
	}
	errs := make([]error, len(srcs))
	t.runBatch(ctx, srcs, dsts, sts, errs, batchSide{
		peer: "owner",
		tooSmall: func(i int) error {
			return fmt.Errorf("%w: destination holds %d of %d bytes", tensor.ErrTooSmall, dsts[i].Len(), srcs[i].Length)
		},
		alone: func(ctx context.Context, i int) (fabric.Stats, error) { return t.Read(ctx, srcs[i], dsts[i]) },
		pipeline: func(c *conn, lane []int, coalesced int) (int, bool, error) {
			return t.pipeline(c, lane, coalesced, srcs, dsts, sts, errs)
		},
	})
	return sts, errs
}

// batchSide is what a read batch and a write batch do differently; the
// grouping into lanes is the same (runBatch).
type batchSide struct {
	peer     string                                                      // "owner" or "destination", for errors
	tooSmall func(i int) error                                           // the local buffer cannot hold remote i
	alone    func(ctx context.Context, i int) (fabric.Stats, error)      // one item on its own (striped, device)
	pipeline func(c *conn, lane []int, coalesced int) (int, bool, error) // a lane's items, pipelined on c
}

// runBatch checks every item, moves the striped and device ones on their
// own (two at a time: each uses several connections already), and
// spreads the rest of each remote peer over lanes run by side.pipeline.
// rems[i] is item i's remote end, bufs[i] its local buffer.
func (t *Transport) runBatch(ctx context.Context, rems []fabric.Remote, bufs []tensor.Buffer, sts []fabric.Stats, errs []error, side batchSide) {
	groups := map[connKey][]int{}
	var keys []connKey
	var alone []int
	for i, rem := range rems {
		addr := rem.Addrs[fabric.TCP]
		switch {
		case rem.Length < 0 || bufs[i].Len() < rem.Length:
			errs[i] = side.tooSmall(i)
		case addr == "":
			errs[i] = fmt.Errorf("%w: %s %s serves no tcp address", fabric.ErrNoPath, side.peer, rem.Peer)
		case len(rem.Claim.Token) > maxToken:
			errs[i] = fmt.Errorf("%w: token of %d bytes", fabric.ErrUnauthorized, len(rem.Claim.Token))
		case tensor.IsDevice(bufs[i]) || rem.Length >= 2*t.cfg.StripeMin || !hostVisible(bufs[i]):
			alone = append(alone, i)
		default:
			k := connKey{rem.Peer, addr}
			if groups[k] == nil {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], i)
		}
	}
	var wg sync.WaitGroup
	next := make(chan int, len(alone))
	for _, i := range alone {
		next <- i
	}
	close(next)
	for range min(2, len(alone)) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range next {
				if err := ctx.Err(); err != nil {
					errs[i] = err
					continue
				}
				sts[i], errs[i] = side.alone(ctx, i)
			}
		}()
	}
	for _, k := range keys {
		idx := groups[k]
		for _, lane := range t.lanes(idx, rems) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				t.lane(ctx, k, lane, errs, func(c *conn) (int, bool, error) {
					return side.pipeline(c, lane, len(idx))
				})
			}()
		}
	}
	wg.Wait()
}

// lanes spreads one owner's items over up to Streams lanes, largest first
// to the least loaded lane, with at least laneBytes per lane.
func (t *Transport) lanes(idx []int, srcs []fabric.Remote) [][]int {
	var total int64
	for _, i := range idx {
		total += srcs[i].Length
	}
	n := int(min(int64(t.cfg.Streams), int64(len(idx)), max(1, total/laneBytes)))
	byLen := slices.Clone(idx)
	slices.SortStableFunc(byLen, func(a, b int) int { return cmp.Compare(srcs[b].Length, srcs[a].Length) })
	out := make([][]int, n)
	load := make([]int64, n)
	for _, i := range byLen {
		l := 0
		for j := range load {
			if load[j] < load[l] {
				l = j
			}
		}
		out[l] = append(out[l], i)
		load[l] += srcs[i].Length + 64 // a request costs something too
	}
	return out
}

// lane moves items over one connection with run (pipeline, or
// pipelineWrites for pushes), which returns how many items it finished,
// whether the connection is still in step, and what put it out of step. A
// pooled connection the owner closed before answering anything is
// replaced once.
func (t *Transport) lane(ctx context.Context, k connKey, items []int, errs []error, run func(c *conn) (int, bool, error)) {
	for attempt := 0; ; attempt++ {
		c, pooled, err := t.pool.Get(ctx, k)
		if err != nil {
			for _, i := range items {
				errs[i] = err
			}
			return
		}
		stop := func() bool { return true }
		if ctx.Done() != nil {
			stop = context.AfterFunc(ctx, c.abort)
		}
		done, inStep, err := run(c)
		if !stop() {
			t.pool.Discard(c)
			cerr := ctx.Err()
			for _, i := range items[done:] {
				errs[i] = cerr
			}
			return
		}
		if inStep {
			t.pool.Put(c)
			return
		}
		t.pool.Discard(c)
		if done == len(items) {
			return
		}
		if pooled && attempt == 0 && done == 0 && errors.Is(err, fabric.ErrPeerClosed) {
			continue
		}
		errs[items[done]] = err
		for _, i := range items[done+1:] {
			errs[i] = fmt.Errorf("%w: queued behind a transfer that broke the connection: %v", fabric.ErrPeerClosed, err)
		}
		return
	}
}

// pipeline sends the requests of items on c back to back and reads the
// answers in order. It returns how many items it finished (moved or
// cleanly refused), whether c is still in step, and the error that put it
// out of step.
func (t *Transport) pipeline(c *conn, items []int, coalesced int, srcs []fabric.Remote, dsts []tensor.Buffer, sts []fabric.Stats, errs []error) (int, bool, error) {
	reqs := make([]byte, 0, len(items)*(maxRequest-maxToken+32))
	compress := make([]bool, len(items))
	reasons := make([]string, len(items))
	ends := make([]int, len(items)) // where each request ends in reqs
	for k, i := range items {
		src := srcs[i]
		req := request{op: opRead, claim: src.Claim, offset: src.Offset, length: src.Length, dtype: src.DType}
		var est linkEstimate
		var codecBps float64
		if t.cfg.Compression == CompressAuto && src.Length >= minCompress {
			est = t.links.get(c.key)
			if est.bps > 0 {
				codecBps = t.codecBps()
			}
		}
		compress[k], reasons[k] = decide(t.cfg.Compression, src.Length, est, codecBps)
		t.m.decided(compress[k], reasons[k]).Inc()
		if compress[k] {
			req.flags = flagCompress
		}
		reqs = req.appendTo(reqs)
		ends[k] = len(reqs)
	}
	// The requests go out from a goroutine of their own while the answers
	// come in: a long list must not wait for the owner's first answers to
	// drain (the owner may be blocked writing them).
	wrote := make(chan error, 1)
	go func() {
		// A few dozen requests a write, the stall deadline re-armed
		// between them: a long list waits for the owner to take in the
		// first ones (it reads a request only once it answered the one
		// before), and that wait is progress, not a stall.
		var err error
		for from, k := 0, 0; k < len(ends) && err == nil; k += writeRequests {
			to := ends[min(k+writeRequests, len(ends))-1]
			c.armWrite()
			_, err = c.Write(reqs[from:to])
			from = to
		}
		if err != nil {
			c.abort() // unblock the reader below
		}
		wrote <- err
	}()
	prev := time.Now()
	fail := func(k int, err error) (int, bool, error) {
		c.abort()
		if werr := <-wrote; werr != nil && !errors.Is(err, fabric.ErrCorrupt) {
			err = t.ioError(werr)
		}
		return k, false, err
	}
	for k, i := range items {
		src := srcs[i]
		refused, err := t.status(c)
		if err != nil {
			if refused {
				errs[i] = err
				continue
			}
			return fail(k, err)
		}
		p, err := tensor.BytesOf(dsts[i])
		if err != nil {
			return fail(k, err)
		}
		wire, err := c.recvBlocks(p[:src.Length], src.Offset, false)
		if err != nil {
			if !errors.Is(err, fabric.ErrCorrupt) {
				err = t.ioError(err)
			}
			return fail(k, err)
		}
		now := time.Now()
		d := now.Sub(prev)
		prev = now
		if src.Length >= minCompress {
			t.links.observe(c.key, compress[k], reasons[k], src.Length, wire, d)
		}
		sts[i] = fabric.Stats{Transport: fabric.TCP, Bytes: src.Length, Duration: d, Streams: 1, Coalesced: coalesced}
	}
	if err := <-wrote; err != nil {
		return len(items), false, t.ioError(err)
	}
	return len(items), true, nil
}

func hostVisible(b tensor.Buffer) bool {
	_, err := tensor.BytesOf(b)
	return err == nil
}
