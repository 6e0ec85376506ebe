package rdt

import (
	"fmt"
	"sort"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/rdt/internal/observe"
	"github.com/tensorlane/tensorlane/tensor"
)

// RecentTransfers is how many finished transfers a runtime remembers for
// observers (the dashboard); older ones drop off the ring.
const RecentTransfers = observe.Recent

// TransferRecord describes one Fetch, Get or GetInto as an observer sees it:
// while it runs (Live) and after it finished. The ring that keeps them is
// rdt/internal/observe's.
type TransferRecord = observe.Record

// ObjectInfo is one row of a runtime's object table.
type ObjectInfo struct {
	ID     string  `json:"id"`
	Host   string  `json:"host"`
	Owner  string  `json:"owner"` // owning actor
	Device string  `json:"device"`
	DType  string  `json:"dtype"`
	Shape  []int64 `json:"shape"`
	Bytes  int64   `json:"bytes"`
	// Pins counts reads in flight that hold the object's memory.
	Pins int `json:"pins"`
	// StagedBytes is the size of the private copy of the object's view
	// made for on-host grants (shm, p2p between processes) because the
	// view is only part of its allocation; 0 when none was needed (yet).
	StagedBytes int64 `json:"staged_bytes,omitempty"`
}

// newObserver is the runtime's observer, its metrics registered with
// device memory's, read at scrape time.
func newObserver(r *Runtime, reg prometheus.Registerer) *observe.Ring {
	o := observe.New()
	if reg != nil {
		reg.MustRegister(append(o.Collectors(), observe.Memory(r.cfg.Host, r.MemoryStats, r.objects.Len))...)
	}
	return o
}

// observeRead records a read by reader of ref into dst in flight; the
// returned func records its end.
func (r *Runtime) observeRead(reader string, ref Ref, dst fabric.Endpoint) func(fabric.Plan, fabric.Stats, error) {
	_, n := ref.span()
	return r.obs.Begin(TransferRecord{
		Start: time.Now(), Object: ref.Object.String(), Owner: shortID(ref.Owner), Reader: reader,
		Src: ref.Host + "/" + ref.Device.String(), Dst: dst.String(), Bytes: n,
	})
}

// RecentTransfers returns the last finished transfers this runtime's actors
// made (at most RecentTransfers), newest first.
func (r *Runtime) RecentTransfers() []TransferRecord { return r.obs.Finished() }

// LiveTransfers returns the transfers in flight, oldest first; Bytes is the
// size being read and Duration the time so far.
func (r *Runtime) LiveTransfers() []TransferRecord { return r.obs.Live() }

// ObjectTable returns the objects this runtime owns, ordered by owner then
// ID.
func (r *Runtime) ObjectTable() []ObjectInfo {
	objs := r.objects.List()
	out := make([]ObjectInfo, 0, len(objs))
	for _, o := range objs {
		out = append(out, ObjectInfo{
			ID: o.ID.String(), Host: r.cfg.Host, Owner: o.Owner, Device: o.Device.String(),
			DType: o.Desc.DType.String(), Shape: append([]int64(nil), o.Desc.Shape...), Bytes: o.Desc.NBytes(), Pins: o.Pins,
			StagedBytes: o.Staged,
		})
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].Owner != out[j].Owner {
			return out[i].Owner < out[j].Owner
		}
		return out[i].ID < out[j].ID
	})
	return out
}

// MemoryStats returns every device's memory statistics in Devices order.
func (r *Runtime) MemoryStats() []tensor.MemStats {
	devs := r.Devices()
	out := make([]tensor.MemStats, 0, len(devs))
	for _, d := range devs {
		m, _ := r.devs.Memory(d)
		out = append(out, m.Stats())
	}
	return out
}

// viewStaged reports an object's view staged as a private copy for an
// on-host grant (n bytes), or a staging that failed.
func (r *Runtime) viewStaged(o *objstore.Object, n int64, err error) {
	if err != nil {
		r.obs.ViewCopyFailures.Inc()
		r.log.Warn("cannot stage a private copy of a view for an on-host grant: the reader falls back to another path",
			"object", o.ID, "bytes", o.End-o.Start, "device", o.Buf.Device(), "err", err)
		return
	}
	r.obs.ViewCopies.Inc()
	r.obs.ViewCopyBytes.Add(float64(n))
	r.log.Debug("view staged as a private copy for on-host grants", "object", o.ID, "bytes", n,
		"view", fmt.Sprintf("[%d,%d)", o.Start, o.End), "parent_bytes", o.Buf.Len(), "device", o.Buf.Device())
}
