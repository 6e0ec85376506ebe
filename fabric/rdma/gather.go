package rdma

import (
	"context"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
)

var _ fabric.GatherWriter = (*Transport)(nil)

// WriteRuns pushes the concatenation of runs of src into the sink dst
// names, straight from src: src is registered once per NIC, as Write's
// source is, the destination range is cut into Write's slices, and each
// slice goes out as WRITEs whose scatter-gather lists (WorkRequest.SGL)
// are the pieces of runs that fill it, at most the device's MaxSGE per
// WRITE. The owner sees ordinary WRITEs of dst.Length bytes. Where a
// rail's device takes too few segments per WRITE for runs that short
// (WRITEs under 256 KiB on average: libfabric's tcp and net providers take
// 4 segments), the runs are packed into a buffer first, counted
// (Metrics.GatherPacked). One run is Write of that range.
func (t *Transport) WriteRuns(ctx context.Context, src tensor.Buffer, runs []fabric.Run, dst fabric.Remote) (fabric.Stats, error) {
	from, err := fabric.RunsSource(fabric.RDMA, src, runs, dst)
	if err != nil {
		return fabric.Stats{}, err
	}
	if len(runs) == 1 {
		r := runs[0]
		return t.transfer(ctx, dst, src.Device(), from[r.Off:r.Off+r.Len], nil, true)
	}
	return t.transfer(ctx, dst, src.Device(), from, runs, true)
}
