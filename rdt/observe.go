package rdt

import (
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/objstore"
	"github.com/tensorlane/tensorlane/tensor"
)

// RecentTransfers is how many finished transfers a runtime remembers for
// observers (the dashboard); older ones drop off the ring.
const RecentTransfers = 256

// TransferRecord describes one Fetch, Get or GetInto as an observer sees it:
// while it runs (Live) and after it finished.
type TransferRecord struct {
	Seq      uint64    `json:"seq"` // per runtime, increasing
	Start    time.Time `json:"start"`
	Object   string    `json:"object"`
	Owner    string    `json:"owner"`  // owner's peer ID, short form
	Reader   string    `json:"reader"` // reading actor
	Src      string    `json:"src"`    // host/device of the object
	Dst      string    `json:"dst"`    // host/device it is read into
	Path     string    `json:"path"`   // transport that moved the bytes ("" when none did)
	Best     string    `json:"best"`   // best transport the topology allows
	Degraded bool      `json:"degraded"`
	// Fallback is set when the transport that moved the bytes is not the
	// one the plan chose first (the first path failed).
	Fallback bool `json:"fallback"`
	ZeroCopy bool `json:"zero_copy,omitempty"`
	// ViewCopy: the owner served a private copy of the object's view (an
	// on-host grant of a view that is only part of its allocation).
	ViewCopy  bool          `json:"view_copy,omitempty"`
	Bytes     int64         `json:"bytes"`
	Duration  time.Duration `json:"duration_ns"`
	GBps      float64       `json:"gbps"`
	Live      bool          `json:"live"`
	Error     string        `json:"error,omitempty"`
	ErrorKind string        `json:"error_kind,omitempty"`
}

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

// observer keeps what the dashboard shows of a runtime: a bounded ring of
// finished transfers and the set in flight. Recording costs a mutex and a
// small struct per transfer, nothing per byte.
type observer struct {
	rt     *Runtime
	errors *prometheus.CounterVec
	// viewCopies, viewCopyBytes: views staged as private copies for
	// on-host grants; viewCopyFailures: stagings refused (no memory).
	viewCopies, viewCopyBytes, viewCopyFailures prometheus.Counter

	mu   sync.Mutex
	seq  uint64
	ring []TransferRecord // len <= RecentTransfers; next is the oldest once full
	next int
	live map[uint64]*TransferRecord
}

// init registers the observer's metrics: transfer errors by kind and device
// memory, read at scrape time.
func (o *observer) init(r *Runtime, reg prometheus.Registerer) {
	o.rt = r
	o.live = map[uint64]*TransferRecord{}
	o.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tensorlane_transfer_errors_total", Help: "Failed reads (Get, Fetch, GetInto), by error kind.",
	}, []string{"kind"})
	// Every kind starts at zero, so rates and alerts see the series before
	// the first error.
	for _, k := range Kinds() {
		o.errors.WithLabelValues(k.Name)
	}
	o.viewCopies = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tensorlane_view_copies_total",
		Help: "Published views of part of an allocation staged as a private copy for on-host grants (shm, p2p), so no reader gets the rest of the allocation.",
	})
	o.viewCopyBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tensorlane_view_copy_bytes_total", Help: "Bytes copied staging views for on-host grants.",
	})
	o.viewCopyFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tensorlane_view_copy_failures_total",
		Help: "On-host grants refused because a view's private copy could not be made (out of device memory); the reader falls back to another path.",
	})
	if reg != nil {
		reg.MustRegister(o.errors, memCollector{r}, o.viewCopies, o.viewCopyBytes, o.viewCopyFailures)
	}
}

// begin records a transfer in flight; the returned func records its end.
func (o *observer) begin(reader string, ref Ref, dst fabric.Endpoint) func(Transfer, error) {
	_, n := ref.span()
	rec := &TransferRecord{
		Start: time.Now(), Object: ref.Object.String(), Owner: shortID(ref.Owner), Reader: reader,
		Src: ref.Host + "/" + ref.Device.String(), Dst: dst.String(), Bytes: n, Live: true,
	}
	o.mu.Lock()
	o.seq++
	rec.Seq = o.seq
	if o.live != nil {
		o.live[rec.Seq] = rec
	}
	o.mu.Unlock()
	return func(x Transfer, err error) { o.end(rec, x, err) }
}

func (o *observer) end(rec *TransferRecord, x Transfer, err error) {
	r := *rec
	r.Live = false
	r.Duration = time.Since(r.Start)
	r.Best, r.Degraded = x.Plan.Best, x.Plan.Degraded
	r.Path = x.Stats.Transport
	r.Fallback = r.Path != "" && x.Plan.Chosen != "" && r.Path != x.Plan.Chosen
	r.ZeroCopy = x.Stats.ZeroCopy
	r.ViewCopy = x.Stats.ViewCopy
	if err != nil {
		r.Error, r.ErrorKind = err.Error(), ErrorKind(err)
		if r.Path == "" {
			r.Path = x.Plan.Chosen
		}
	} else {
		r.Bytes = x.Stats.Bytes
		if x.Stats.Duration > 0 {
			r.Duration = x.Stats.Duration
		}
		r.GBps = float64(r.Bytes) / r.Duration.Seconds() / 1e9
	}
	o.mu.Lock()
	delete(o.live, rec.Seq)
	if len(o.ring) < RecentTransfers {
		o.ring = append(o.ring, r)
	} else {
		o.ring[o.next] = r
		o.next = (o.next + 1) % RecentTransfers
	}
	o.mu.Unlock()
	if err != nil && o.errors != nil {
		o.errors.WithLabelValues(r.ErrorKind).Inc()
	}
}

// RecentTransfers returns the last finished transfers this runtime's actors
// made (at most RecentTransfers), newest first.
func (r *Runtime) RecentTransfers() []TransferRecord {
	o := &r.obs
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]TransferRecord, 0, len(o.ring))
	for i := len(o.ring) - 1; i >= 0; i-- {
		out = append(out, o.ring[(o.next+i)%len(o.ring)])
	}
	return out
}

// LiveTransfers returns the transfers in flight, oldest first; Bytes is the
// size being read and Duration the time so far.
func (r *Runtime) LiveTransfers() []TransferRecord {
	o := &r.obs
	o.mu.Lock()
	out := make([]TransferRecord, 0, len(o.live))
	for _, t := range o.live {
		out = append(out, *t)
	}
	o.mu.Unlock()
	now := time.Now()
	for i := range out {
		out[i].Duration = now.Sub(out[i].Start)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Seq < out[j].Seq })
	return out
}

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
		out = append(out, r.devices[d].Stats())
	}
	return out
}

// memCollector exports device memory at scrape time, so the gauges never go
// stale and nothing polls.
type memCollector struct{ r *Runtime }

var (
	memUsedDesc = prometheus.NewDesc("tensorlane_device_memory_used_bytes",
		"Bytes in live allocations on a device.", []string{"host", "device", "simulated"}, nil)
	memCapDesc = prometheus.NewDesc("tensorlane_device_memory_capacity_bytes",
		"A device's memory capacity (0: unbounded).", []string{"host", "device", "simulated"}, nil)
	objectsDesc = prometheus.NewDesc("tensorlane_objects",
		"Live objects the runtime owns.", []string{"host"}, nil)
)

func (c memCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- memUsedDesc
	ch <- memCapDesc
	ch <- objectsDesc
}

func (c memCollector) Collect(ch chan<- prometheus.Metric) {
	host := c.r.cfg.Host
	for _, s := range c.r.MemoryStats() {
		sim := "false"
		if s.Simulated {
			sim = "true"
		}
		ch <- prometheus.MustNewConstMetric(memUsedDesc, prometheus.GaugeValue, float64(s.Used), host, s.Device.String(), sim)
		ch <- prometheus.MustNewConstMetric(memCapDesc, prometheus.GaugeValue, float64(s.Capacity), host, s.Device.String(), sim)
	}
	ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(c.r.objects.Len()), host)
}

// viewStaged reports an object's view staged as a private copy for an
// on-host grant (n bytes), or a staging that failed.
func (r *Runtime) viewStaged(o *objstore.Object, n int64, err error) {
	if err != nil {
		r.obs.viewCopyFailures.Inc()
		r.log.Warn("cannot stage a private copy of a view for an on-host grant: the reader falls back to another path",
			"object", o.ID, "bytes", o.End-o.Start, "device", o.Buf.Device(), "err", err)
		return
	}
	r.obs.viewCopies.Inc()
	r.obs.viewCopyBytes.Add(float64(n))
	r.log.Debug("view staged as a private copy for on-host grants", "object", o.ID, "bytes", n,
		"view", fmt.Sprintf("[%d,%d)", o.Start, o.End), "parent_bytes", o.Buf.Len(), "device", o.Buf.Device())
}
