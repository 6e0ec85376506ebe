package observe

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/tensorlane/tensorlane/tensor"
)

// Memory exports a runtime's device memory and object count at scrape
// time, so the gauges never go stale and nothing polls: stats lists every
// device's memory, objects counts the live objects the runtime owns.
func Memory(host string, stats func() []tensor.MemStats, objects func() int) prometheus.Collector {
	return memory{host, stats, objects}
}

type memory struct {
	host    string
	stats   func() []tensor.MemStats
	objects func() int
}

var (
	memUsedDesc = prometheus.NewDesc("tensorlane_device_memory_used_bytes",
		"Bytes in live allocations on a device.", []string{"host", "device", "simulated"}, nil)
	memCapDesc = prometheus.NewDesc("tensorlane_device_memory_capacity_bytes",
		"A device's memory capacity (0: unbounded).", []string{"host", "device", "simulated"}, nil)
	objectsDesc = prometheus.NewDesc("tensorlane_objects",
		"Live objects the runtime owns.", []string{"host"}, nil)
)

func (c memory) Describe(ch chan<- *prometheus.Desc) {
	ch <- memUsedDesc
	ch <- memCapDesc
	ch <- objectsDesc
}

func (c memory) Collect(ch chan<- prometheus.Metric) {
	for _, s := range c.stats() {
		sim := "false"
		if s.Simulated {
			sim = "true"
		}
		ch <- prometheus.MustNewConstMetric(memUsedDesc, prometheus.GaugeValue, float64(s.Used), c.host, s.Device.String(), sim)
		ch <- prometheus.MustNewConstMetric(memCapDesc, prometheus.GaugeValue, float64(s.Capacity), c.host, s.Device.String(), sim)
	}
	ch <- prometheus.MustNewConstMetric(objectsDesc, prometheus.GaugeValue, float64(c.objects()), c.host)
}
