package sched

import (
	"testing"

	"github.com/tensorlane/tensorlane/internal/testhelp"

	"github.com/tensorlane/tensorlane/topology"
)

// BenchmarkPlace100kGPUs places one gang of 1,000 chained four-GPU bundles
// (pipeline traffic between neighbours) onto 1,389 GB200 NVL72 racks
// (25,002 trays, 100,008 GPUs): the fleet-size case of issue 28. The
// scheduler is built inside the loop, as a caller placing once would.
func BenchmarkPlace100kGPUs(b *testing.B) {
	c, err := topology.PresetCluster("gb200-nvl72", 25002, 0)
	if err != nil {
		b.Fatal(err)
	}
	req := Request{}
	for i := 0; i < 1000; i++ {
		req.Bundles = append(req.Bundles, Bundle{Kind: topology.KindGPU, Devices: 4})
		if i > 0 {
			req.Traffic = append(req.Traffic, Flow{From: i - 1, To: i, Gbps: 800})
		}
	}
	b.ReportAllocs()
	// CPU seconds per placement, the figure that holds on a loaded
	// machine (wall time there measures the neighbours).
	cpu0 := testhelp.CPUTime()
	for b.Loop() {
		s, err := New(c, Config{})
		if err != nil {
			b.Fatal(err)
		}
		if _, err := s.Place(req); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric((testhelp.CPUTime()-cpu0).Seconds()/float64(b.N), "cpu-s/op")
}
