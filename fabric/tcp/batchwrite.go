package tcp

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/internal/tcodec"
	"github.com/tensorlane/tensorlane/tensor"
)

// Batched pushes (fabric.BatchWriter). The writes to many sinks of one
// destination go out back to back on a few connections (lanes, as for
// ReadBatch), each as an eager write: the request with its blocks right
// behind it, no go-ahead awaited. The server already serves a
// connection's requests one after another and answers each write with
// one status once its blocks verified, so the acknowledgements stream back
// in order while later writes are still going out: a batch of small
// pushes pays one round trip per lane instead of one or two per push. A
// refused write (closed, unknown, forged sink) is answered with its status
// and its blocks are skipped, so the lane stays in step; a write whose
// data breaks the connection (corrupt, destination gone) fails, and the
// writes queued behind it on that lane fail with fabric.ErrPeerClosed,
// which the planner pushes again on their own. A refused write's blocks
// are sent all the same (the server skips them): at most 2 x StripeMin
// wasted per refused item, the price of not waiting for a go-ahead.
// Objects large enough to be
// striped (2 x StripeMin and up) and device sources are pushed with Write,
// beside the lanes.

var _ fabric.BatchWriter = (*Transport)(nil)

// WriteBatch pushes srcs[i] into the sink dsts[i] names for every i; see
// fabric.BatchWriter.
func (t *Transport) WriteBatch(ctx context.Context, srcs []tensor.Buffer, dsts []fabric.Remote) ([]fabric.Stats, []error) {
	sts := make([]fabric.Stats, len(dsts))
	if errs := fabric.CheckWriteBatch(srcs, dsts); errs != nil {
		return sts, errs
	}
	errs := make([]error, len(dsts))
	t.runBatch(ctx, dsts, srcs, sts, errs, batchSide{
		peer: "destination",
		tooSmall: func(i int) error {
			return fmt.Errorf("%w: source holds %d of %d bytes", fabric.ErrBadRequest, srcs[i].Len(), dsts[i].Length)
		},
		alone: func(ctx context.Context, i int) (fabric.Stats, error) { return t.Write(ctx, srcs[i], dsts[i]) },
		pipeline: func(c *conn, lane []int, coalesced int) (int, bool, error) {
			return t.pipelineWrites(c, lane, coalesced, srcs, dsts, sts, errs)
		},
	})
	return sts, errs
}

// pipelineWrites sends the eager writes of items on c back to back and
// reads their acknowledgements in order. It returns how many items it
// finished (acknowledged or cleanly refused), whether c is still in step,
// and the error that put it out of step.
func (t *Transport) pipelineWrites(c *conn, items []int, coalesced int, srcs []tensor.Buffer, dsts []fabric.Remote, sts []fabric.Stats, errs []error) (int, bool, error) {
	compress := make([]bool, len(items))
	reasons := make([]string, len(items))
	data := make([][]byte, len(items))
	for k, i := range items {
		dst := dsts[i]
		p, err := tensor.BytesOf(srcs[i])
		if err != nil {
			return 0, false, err // WriteBatch sent only host-visible sources here
		}
		data[k] = p[:dst.Length]
		var est linkEstimate
		var codecBps float64
		if t.cfg.Compression == CompressAuto && dst.Length >= minCompress {
			est = t.links.get(c.key)
			if est.bps > 0 {
				codecBps = t.codecBps()
			}
		}
		compress[k], reasons[k] = decide(t.cfg.Compression, dst.Length, est, codecBps)
		t.m.decided(compress[k], reasons[k]).Inc()
	}
	// The writes go out from a goroutine of their own while the
	// acknowledgements come in: the destination answers each write once
	// it has taken its blocks, and must not block on a full socket while
	// this side is still sending.
	wrote := make(chan error, 1)
	wires := make([]atomic.Int64, len(items)) // what each write put on the wire, for the link estimate
	go func() {
		var err error
		var req []byte
		for k, i := range items {
			dst := dsts[i]
			r := request{op: opWrite, claim: dst.Claim, offset: dst.Offset, length: dst.Length, dtype: dst.DType, flags: flagEager}
			if compress[k] {
				r.flags |= flagCompress
			}
			req = r.appendTo(req[:0])
			var w int64
			if w, err = c.sendBlocks(req, data[k], t.cfg.ChunkSize, compress[k], tcodec.HintFor(dst.DType), t.corruptNext.Swap(false), false); err != nil {
				break
			}
			wires[k].Store(w - int64(len(req)))
		}
		if err != nil {
			c.abort() // unblock the reader below
		}
		wrote <- err
	}()
	prev := time.Now()
	fail := func(k int, err error) (int, bool, error) {
		c.abort()
		if werr := <-wrote; werr != nil && !errors.Is(err, fabric.ErrCorrupt) && !errors.Is(err, fabric.ErrPeerClosed) {
			err = t.ioError(werr)
		}
		return k, false, err
	}
	for k, i := range items {
		refused, err := t.status(c)
		if err != nil {
			if refused {
				errs[i] = err
				continue
			}
			return fail(k, err)
		}
		now := time.Now()
		d := now.Sub(prev)
		prev = now
		n := dsts[i].Length
		if w := wires[k].Load(); n >= minCompress && w > 0 {
			t.links.observe(c.key, compress[k], reasons[k], n, w, d)
		}
		sts[i] = fabric.Stats{Transport: fabric.TCP, Bytes: n, Duration: d, Streams: 1, Coalesced: coalesced}
	}
	if err := <-wrote; err != nil {
		return len(items), false, t.ioError(err)
	}
	return len(items), true, nil
}
