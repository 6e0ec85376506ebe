package rdt

import "github.com/prometheus/client_golang/prometheus"

// bcastMetrics counts broadcasts and how they went.
type bcastMetrics struct {
	readers  *prometheus.CounterVec // per reader outcome
	reroutes prometheus.Counter     // readers re-parented after a failed parent
	bytes    prometheus.Counter
	skipped  prometheus.Counter // chunks a re-parented reader had, not sent again
}

func newBcastMetrics(reg prometheus.Registerer) *bcastMetrics {
	m := &bcastMetrics{
		readers: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "tensorlane", Subsystem: "broadcast", Name: "readers_total",
			Help: "Broadcast readers by outcome (ok, failed)."}, []string{"outcome"}),
		reroutes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tensorlane", Subsystem: "broadcast", Name: "reroutes_total",
			Help: "Readers re-parented because their parent in the tree failed or died: to a live ancestor, else the owner (a worse path, made visible)."}),
		bytes: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tensorlane", Subsystem: "broadcast", Name: "bytes_total",
			Help: "Bytes broadcast (object size × readers that got it)."}),
		skipped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: "tensorlane", Subsystem: "broadcast", Name: "repeats_skipped_total",
			Help: "Chunks a re-parented reader of this runtime had already, so its new feeder did not send them again."}),
	}
	reg.MustRegister(m.readers, m.reroutes, m.bytes, m.skipped)
	return m
}

func (r *Runtime) bcastMetrics(res *BroadcastResult) {
	for _, rr := range res.Readers {
		if rr.Err == nil {
			r.bmet.readers.WithLabelValues("ok").Inc()
			r.bmet.bytes.Add(float64(res.Bytes))
		} else {
			r.bmet.readers.WithLabelValues("failed").Inc()
		}
	}
	if n := len(res.Readers) - res.OK(); n > 0 {
		r.log.Warn("broadcast incomplete", "readers", len(res.Readers), "failed", n, "err", res.Err())
	}
}
