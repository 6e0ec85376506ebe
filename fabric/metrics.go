package fabric

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts transfers by transport. One set per runtime, registered on
// the runtime's registry, so several runtimes in one process do not clash.
type Metrics struct {
	Bytes     *prometheus.CounterVec   // tensorlane_transfer_bytes_total{transport}
	Transfers *prometheus.CounterVec   // tensorlane_transfers_total{transport,result}
	Fallbacks *prometheus.CounterVec   // tensorlane_fallbacks_total{from,to}
	Retries   *prometheus.CounterVec   // tensorlane_path_retries_total{transport}
	Degraded  *prometheus.CounterVec   // tensorlane_degraded_transfers_total{best,used}
	Seconds   *prometheus.HistogramVec // tensorlane_transfer_seconds{transport}
	// Coalesced counts the transfers a batch moved together with others of
	// the same owner and path (BatchReader): tensorlane_coalesced_transfers_total{transport}.
	Coalesced *prometheus.CounterVec
	// GatherPacked counts gathered pushes (Planner.WriteRuns) that a path
	// without GatherWriter took packed into a staging buffer first:
	// tensorlane_gather_packed_total{transport}.
	GatherPacked *prometheus.CounterVec
}

// NewMetrics creates the metrics and registers them on reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		Bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_transfer_bytes_total", Help: "Bytes moved, by transport.",
		}, []string{"transport"}),
		Transfers: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_transfers_total", Help: "Transfers, by transport and result (ok, error).",
		}, []string{"transport", "result"}),
		Fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_fallbacks_total", Help: "Transfers that failed on one transport and were retried on the next.",
		}, []string{"from", "to"}),
		Retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_path_retries_total", Help: "Failed transfers tried again on the same transport.",
		}, []string{"transport"}),
		Degraded: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_degraded_transfers_total", Help: "Transfers that used a worse transport than the topology allows.",
		}, []string{"best", "used"}),
		Seconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "tensorlane_transfer_seconds", Help: "Transfer latency, by transport.",
			Buckets: prometheus.ExponentialBuckets(1e-6, 4, 14),
		}, []string{"transport"}),
		Coalesced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_coalesced_transfers_total", Help: "Transfers of a batch moved together with others of the same owner and path, by transport.",
		}, []string{"transport"}),
		GatherPacked: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_gather_packed_total", Help: "Gathered pushes (runs of an object) a path without a gathered write took packed into a staging buffer first: one copy of their bytes more, by transport.",
		}, []string{"transport"}),
	}
	if reg != nil {
		reg.MustRegister(m.Bytes, m.Transfers, m.Fallbacks, m.Retries, m.Degraded, m.Seconds, m.Coalesced, m.GatherPacked)
	}
	return m
}
