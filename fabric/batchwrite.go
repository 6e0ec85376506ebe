package fabric

import (
	"context"

	"github.com/tensorlane/tensorlane/tensor"
)

// Batched pushes, the counterpart of BatchReader. A trainer pushing a
// state dict into a reader's slots writes hundreds of objects to one
// destination; pushed one by one, each pays the destination's round trips
// (tcp: a request and its acknowledgement; rdma: resolving the sink) even
// when its bytes take microseconds. A transport that can write many sinks
// of one destination together implements BatchWriter; Planner.WriteBatch
// groups a batch's items exactly as ReadBatch does (runBatch, batch.go).

// BatchWriter is the optional capability of Writers that push many
// objects together: tcp pipelines the writes of one destination on its
// connections, rdma resolves every sink of one destination in one control
// round trip before posting the writes, shm and p2p get every sink of one
// destination granted (writable, each its own pages) in one round trip.
type BatchWriter interface {
	// WriteBatch pushes the first dsts[i].Length bytes of srcs[i] into the
	// sink dsts[i] names, for every i, and returns each item's Stats and
	// error; both slices have len(srcs) entries. Items succeed or fail on
	// their own: a closed, unknown or forged sink fails its item and no
	// other. The sinks may belong to several destinations. When ctx ends,
	// items not complete fail with its error. As with Write, a failed
	// item's sink content is undefined; a succeeded item's is complete.
	WriteBatch(ctx context.Context, srcs []tensor.Buffer, dsts []Remote) ([]Stats, []error)
}

// CheckWriteBatch returns per-item errors for arguments a WriteBatch
// cannot run on at all (mismatched lengths), or nil.
func CheckWriteBatch(srcs []tensor.Buffer, dsts []Remote) []error {
	return checkLengths(len(srcs), len(dsts), len(dsts), "sinks")
}

// CoalescesWrites reports whether WriteBatch would coalesce a push plan's
// transfer with others to the same destination (its chosen transport is a
// BatchWriter).
func (p Plan) CoalescesWrites() bool {
	_, ok := p.ChosenTransport().(BatchWriter)
	return ok
}

// WriteBatch pushes bufs[i], which lives at srcs[i], into the sink dsts[i]
// names, for every i. Items whose chosen transport is a BatchWriter are
// coalesced: one WriteBatch per (transport, destination peer) with two
// items or more. An item that fails there for a reason another try might
// not repeat is pushed again on its own (Write: retries, then fallback,
// logged and counted); items of other transports are pushed with Write,
// parallel at a time (default 4). The result has one entry per item.
func (p *Planner) WriteBatch(ctx context.Context, srcs []Endpoint, bufs []tensor.Buffer, dsts []Remote, parallel int) []BatchResult {
	res := make([]BatchResult, len(dsts))
	errs := CheckWriteBatch(bufs, dsts)
	if errs == nil && len(srcs) != len(dsts) {
		errs = CheckWriteBatch(make([]tensor.Buffer, len(srcs)), dsts)
	}
	if errs != nil {
		for i, err := range errs {
			res[i].Err = err
		}
		return res
	}
	for i, dst := range dsts {
		res[i].Plan = p.PlanWrite(srcs[i], dst)
	}
	p.runBatch(ctx, res, parallel, batchOps{
		peer:      func(i int) string { return dsts[i].Peer },
		object:    func(i int) ObjectID { return dsts[i].Claim.Object },
		coalesces: Plan.CoalescesWrites,
		together: func(t Transport, idx []int) ([]Stats, []error) {
			b := make([]tensor.Buffer, len(idx))
			d := make([]Remote, len(idx))
			for k, i := range idx {
				b[k], d[k] = bufs[i], dsts[i]
			}
			return t.(BatchWriter).WriteBatch(ctx, b, d)
		},
		alone: func(i int) (Stats, Plan, error) { return p.Write(ctx, srcs[i], bufs[i], dsts[i]) },
	})
	return res
}
