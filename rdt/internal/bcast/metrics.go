package bcast

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts broadcasts and how they went, on one runtime.
type Metrics struct {
	Readers  *prometheus.CounterVec // per reader outcome: "ok" or "failed"
	Reroutes prometheus.Counter     // readers re-parented after a failed parent
	Bytes    prometheus.Counter     // object size × readers that got it
	Skipped  prometheus.Counter     // chunks a re-parented reader had, not sent again
}

// NewMetrics registers a runtime's broadcast metrics with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Readers: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "tensorlane", Subsystem: "broadcast", Name: "readers_total",
			Help: "Broadcast readers by outcome (ok, failed)."}, []string{"outcome"}),
		Reroutes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tensorlane", Subsystem: "broadcast", Name: "reroutes_total",
			Help: "Readers re-parented because their parent in the tree failed or died: to a live ancestor, else the owner (a worse path, made visible)."}),
		Bytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tensorlane", Subsystem: "broadcast", Name: "bytes_total",
			Help: "Bytes broadcast (object size × readers that got it)."}),
		Skipped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tensorlane", Subsystem: "broadcast", Name: "repeats_skipped_total",
			Help: "Chunks a re-parented reader of this runtime had already, so its new feeder did not send them again."}),
	}
	reg.MustRegister(m.Readers, m.Reroutes, m.Bytes, m.Skipped)
	return m
}
