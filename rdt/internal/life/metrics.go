package life

import "github.com/prometheus/client_golang/prometheus"

// Metrics count rdt's lifecycle machinery: heartbeats and peer deaths,
// leases served, held and granted, objects freed, Gets failed by an owner's
// death.
type Metrics struct {
	Heartbeats    *prometheus.CounterVec // tensorlane_heartbeats_total{result}
	PeerDeaths    *prometheus.CounterVec // tensorlane_peer_deaths_total{reason}
	LeaseRequests *prometheus.CounterVec // tensorlane_lease_requests_total{op}
	LeaseMessages *prometheus.CounterVec // tensorlane_lease_messages_total{op}
	LeasesExpired prometheus.Counter     // tensorlane_leases_expired_total
	LeasesHeld    prometheus.GaugeFunc   // tensorlane_leases_held (this runtime's, as a reader)
	LeasesGranted prometheus.GaugeFunc   // tensorlane_leases_granted (on this runtime's objects)
	ObjectsFreed  *prometheus.CounterVec // tensorlane_objects_freed_total{why}
	OwnerDied     prometheus.Counter     // tensorlane_owner_died_errors_total
}

// NewMetrics makes the metrics and registers them with reg (when not nil);
// held and granted are read at scrape time: the leases this runtime holds as
// a reader, and those it granted on its objects.
func NewMetrics(reg prometheus.Registerer, held, granted func() int) *Metrics {
	m := &Metrics{
		Heartbeats: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_heartbeats_total", Help: "Heartbeats sent to watched peers, by result (ok, missed).",
		}, []string{"result"}),
		PeerDeaths: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_peer_deaths_total", Help: "Peer incarnations declared dead, by reason.",
		}, []string{"reason"}),
		LeaseRequests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_lease_requests_total", Help: "Lease claims served by this runtime as owner, by op (lease, release).",
		}, []string{"op"}),
		LeaseMessages: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_lease_messages_total", Help: "Lease messages (each carrying many claims) served by this runtime as owner, by op (lease, release).",
		}, []string{"op"}),
		LeasesExpired: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_leases_expired_total", Help: "Reader leases on this runtime's objects that expired without renewal.",
		}),
		LeasesHeld: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tensorlane_leases_held", Help: "Refs this runtime holds leases on, as a reader.",
		}, func() float64 { return float64(held()) }),
		LeasesGranted: prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "tensorlane_leases_granted", Help: "Reader leases on this runtime's objects.",
		}, func() float64 { return float64(granted()) }),
		ObjectsFreed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tensorlane_objects_freed_total", Help: "Objects removed from the object table, by cause.",
		}, []string{"why"}),
		OwnerDied: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tensorlane_owner_died_errors_total", Help: "Reads and holds that failed with ErrOwnerDied, each failed call once.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.Heartbeats, m.PeerDeaths, m.LeaseRequests, m.LeaseMessages, m.LeasesExpired, m.LeasesHeld, m.LeasesGranted, m.ObjectsFreed, m.OwnerDied)
	}
	return m
}
