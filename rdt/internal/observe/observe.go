// Package observe keeps what an observer (the dashboard) sees of a
// runtime's reads: a bounded ring of finished transfers, the set in
// flight, the counters of failed reads by error kind and of views staged
// as private copies, and the device memory gauges (Memory). Recording
// costs a mutex and a small struct per transfer, nothing per byte. rdt's TransferRecord is its Record; rdt says what a
// transfer is and how its error is named.
package observe

import (
	"sort"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/errs"
)

// Recent is how many finished transfers a Ring remembers; older ones
// drop off.
const Recent = 256

// Record describes one Fetch, Get or GetInto as an observer sees it: while
// it runs (Live) and after it finished (rdt.TransferRecord).
type Record struct {
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

// Ring is a runtime's observer; build it with New.
type Ring struct {
	// Errors counts failed reads by kind (tensorlane_transfer_errors_total).
	Errors *prometheus.CounterVec
	// ViewCopies, ViewCopyBytes: views staged as private copies for
	// on-host grants; ViewCopyFailures: stagings refused (no memory).
	ViewCopies, ViewCopyBytes, ViewCopyFailures prometheus.Counter

	mu   sync.Mutex
	seq  uint64
	ring []Record // len <= Recent; next is the oldest once full
	next int
	live map[uint64]*Record
}

// New is an empty ring whose error counter starts every error kind
// (errs.Kinds) at zero, so rates and alerts see the series before the
// first error.
func New() *Ring {
	o := &Ring{live: map[uint64]*Record{}}
	o.Errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tensorlane_transfer_errors_total", Help: "Failed reads (Get, Fetch, GetInto), by error kind.",
	}, []string{"kind"})
	for _, k := range errs.Kinds() {
		o.Errors.WithLabelValues(k.Name)
	}
	o.ViewCopies = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tensorlane_view_copies_total",
		Help: "Published views of part of an allocation staged as a private copy for on-host grants (shm, p2p), so no reader gets the rest of the allocation.",
	})
	o.ViewCopyBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tensorlane_view_copy_bytes_total", Help: "Bytes copied staging views for on-host grants.",
	})
	o.ViewCopyFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "tensorlane_view_copy_failures_total",
		Help: "On-host grants refused because a view's private copy could not be made (out of device memory); the reader falls back to another path.",
	})
	return o
}

// Collectors are the ring's metrics, for a registry.
func (o *Ring) Collectors() []prometheus.Collector {
	return []prometheus.Collector{o.Errors, o.ViewCopies, o.ViewCopyBytes, o.ViewCopyFailures}
}

// Begin records rec (Start, who and what; Bytes the size being read) as in
// flight; the returned func records its end: the plan and stats of the
// transfer and its error (named by its kind, errs.KindOf).
func (o *Ring) Begin(rec Record) func(plan fabric.Plan, st fabric.Stats, err error) {
	rec.Live = true
	o.mu.Lock()
	o.seq++
	rec.Seq = o.seq
	o.live[rec.Seq] = &rec
	o.mu.Unlock()
	return func(plan fabric.Plan, st fabric.Stats, err error) { o.end(rec, plan, st, err) }
}

func (o *Ring) end(r Record, plan fabric.Plan, st fabric.Stats, err error) {
	r.Live = false
	r.Duration = time.Since(r.Start)
	r.Best, r.Degraded = plan.Best, plan.Degraded
	r.Path = st.Transport
	r.Fallback = r.Path != "" && plan.Chosen != "" && r.Path != plan.Chosen
	r.ZeroCopy = st.ZeroCopy
	r.ViewCopy = st.ViewCopy
	if err != nil {
		r.Error, r.ErrorKind = err.Error(), errs.KindOf(err)
		if r.Path == "" {
			r.Path = plan.Chosen
		}
	} else {
		r.Bytes = st.Bytes
		if st.Duration > 0 {
			r.Duration = st.Duration
		}
		r.GBps = float64(r.Bytes) / r.Duration.Seconds() / 1e9
	}
	o.mu.Lock()
	delete(o.live, r.Seq)
	if len(o.ring) < Recent {
		o.ring = append(o.ring, r)
	} else {
		o.ring[o.next] = r
		o.next = (o.next + 1) % Recent
	}
	o.mu.Unlock()
	if err != nil {
		o.Errors.WithLabelValues(r.ErrorKind).Inc()
	}
}

// Finished returns the last finished transfers (at most Recent), newest
// first.
func (o *Ring) Finished() []Record {
	o.mu.Lock()
	defer o.mu.Unlock()
	out := make([]Record, 0, len(o.ring))
	for i := len(o.ring) - 1; i >= 0; i-- {
		out = append(out, o.ring[(o.next+i)%len(o.ring)])
	}
	return out
}

// Live returns the transfers in flight, oldest first; Bytes is the size
// being read and Duration the time so far.
func (o *Ring) Live() []Record {
	o.mu.Lock()
	out := make([]Record, 0, len(o.live))
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
