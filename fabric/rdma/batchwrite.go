package rdma

import (
	"context"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

// Batched pushes (fabric.BatchWriter). Write pays a control round trip per
// object before its first WRITE can be posted: the destination resolves,
// pins and registers the sink. WriteBatch resolves the sinks of one
// destination together, up to maxBatch per round trip (a write batch,
// control kind 5, batchwire.go), and posts each chunk's writes over the
// rails as soon as it is resolved, while the next chunk resolves; it is
// ReadBatch's machinery (batch.go) run the other way. A destination that
// does not know write batches refuses them (ErrBadRequest) and the batch
// is pushed object by object instead.

var _ fabric.BatchWriter = (*Transport)(nil)

// WriteBatch pushes srcs[i] into the sink dsts[i] names for every i; see
// fabric.BatchWriter.
func (t *Transport) WriteBatch(ctx context.Context, srcs []tensor.Buffer, dsts []fabric.Remote) ([]fabric.Stats, []error) {
	if errs := fabric.CheckWriteBatch(srcs, dsts); errs != nil {
		return make([]fabric.Stats, len(dsts)), errs
	}
	return t.batch(ctx, dsts, srcs, true)
}
