package rdma

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts the rdma transport's rails. The caller creates one set
// per runtime and registers it on the runtime's registry, as with
// fabric.NewMetrics. Rail labels read "<local NIC>-><owner NIC>".
type Metrics struct {
	RailBytes  *prometheus.CounterVec // tensorlane_rdma_rail_bytes_total{rail}
	Slices     *prometheus.CounterVec // tensorlane_rdma_slices_total{rail,result}
	SliceRetry prometheus.Counter     // tensorlane_rdma_slice_retries_total
	RailPauses *prometheus.CounterVec // tensorlane_rdma_rail_pauses_total{rail}
	// HealthPauses counts rails that link telemetry marked degraded
	// (Transport.Degrade): tensorlane_rail_health_pauses_total{rail}.
	HealthPauses *prometheus.CounterVec
	// DeviceStaged counts transfers of device memory staged through host
	// memory instead of registered with the NICs (GPUDirect RDMA), by
	// reason (gpudirect.go): tensorlane_rdma_device_staged_total{reason}.
	DeviceStaged *prometheus.CounterVec
	// GatherPacked counts gathered pushes (WriteRuns) packed into a
	// buffer first because a rail's device takes too few segments per
	// WRITE (rdma.SGELimit) for runs that short:
	// tensorlane_rdma_gather_packed_total.
	GatherPacked prometheus.Counter
}

// NewMetrics creates the metrics and registers them on reg (nil: not
// registered).
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		RailBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_rdma_rail_bytes_total", Help: "Bytes moved over each rdma rail.",
		}, []string{"rail"}),
		Slices: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_rdma_slices_total", Help: "Slices of rdma transfers, by rail and result (ok, error).",
		}, []string{"rail", "result"}),
		SliceRetry: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_rdma_slice_retries_total", Help: "Slices that failed on one rail and were moved to another.",
		}),
		RailPauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_rdma_rail_pauses_total", Help: "Times a failing rail was paused (backoff).",
		}, []string{"rail"}),
		HealthPauses: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_rail_health_pauses_total", Help: "Times link telemetry marked an rdma rail degraded (no new slices until it recovers).",
		}, []string{"rail"}),
		DeviceStaged: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_rdma_device_staged_total", Help: "Device-memory transfers staged through host memory instead of registered with the NIC (GPUDirect RDMA), by reason.",
		}, []string{"reason"}),
		GatherPacked: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_rdma_gather_packed_total", Help: "Gathered rdma pushes packed into a buffer first (a rail's device takes too few segments per WRITE for the runs).",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.RailBytes, m.Slices, m.SliceRetry, m.RailPauses, m.HealthPauses, m.DeviceStaged, m.GatherPacked)
	}
	return m
}
