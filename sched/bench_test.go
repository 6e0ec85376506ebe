package sched

import (
	"testing"

	"github.com/tensorlane/tensorlane/topology"
)

// BenchmarkPlace10kGPUs places 1,000 bundles onto 139 GB200 NVL72 racks
// (2,502 trays, 10,008 GPUs): one gang of 1,000 four-GPU bundles with
// pipeline traffic, one of 1,000 single-GPU bundles, and 1,000 separate
// single-bundle reservations.
func BenchmarkPlace10kGPUs(b *testing.B) {
	c, err := topology.PresetCluster("gb200-nvl72", 2502, 0)
	if err != nil {
		b.Fatal(err)
	}
	gang := func(devices int) Request {
		req := Request{}
		for i := 0; i < 1000; i++ {
			req.Bundles = append(req.Bundles, Bundle{Kind: topology.KindGPU, Devices: devices})
			if i > 0 {
				req.Traffic = append(req.Traffic, Flow{From: i - 1, To: i, Gbps: 800})
			}
		}
		return req
	}
	for _, tc := range []struct {
		name string
		req  Request
	}{{"gang-1000x4gpu-pipeline", gang(4)}, {"gang-1000x1gpu-pipeline", gang(1)}} {
		b.Run(tc.name, func(b *testing.B) {
			s, err := New(c, Config{})
			if err != nil {
				b.Fatal(err)
			}
			b.ReportAllocs()
			for b.Loop() {
				if _, err := s.Place(tc.req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
	b.Run("1000-reservations", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			s, err := New(c, Config{})
			if err != nil {
				b.Fatal(err)
			}
			for i := 0; i < 1000; i++ {
				if _, err := s.Reserve("", Request{Bundles: []Bundle{{Kind: topology.KindGPU, Devices: 1 + i%4}}}); err != nil {
					b.Fatal(err)
				}
			}
		}
	})
}

// BenchmarkQuality reports placement quality as ratios of estimated
// transfer times: against first-fit on traffic-heavy requests spanning
// racks (goal <= 0.5), and against the brute-force optimum on small
// instances (goal: mean <= 1.10).
//
// The greedy-only variants turn the partition start off, to show what it
// adds.
func BenchmarkQuality(b *testing.B) {
	for _, v := range []struct {
		name string
		cfg  Config
	}{{"", Config{}}, {"greedy-only/", Config{noPartition: true}}} {
		b.Run(v.name+"vs-first-fit", func(b *testing.B) {
			var spanning, fitting ratios
			for b.Loop() {
				spanning, fitting = qualityVsFirstFit(b, v.cfg, 16)
			}
			b.ReportMetric(spanning.mean(), "span-mean")
			b.ReportMetric(spanning.worst, "span-worst")
			b.ReportMetric(fitting.mean(), "fit-mean")
		})
		b.Run(v.name+"vs-optimum", func(b *testing.B) {
			var q ratios
			for b.Loop() {
				q = qualityVsOptimum(b, v.cfg, 300)
			}
			b.ReportMetric(q.mean(), "ratio-mean")
			b.ReportMetric(q.worst, "ratio-worst")
			b.ReportMetric(float64(q.n), "instances")
		})
	}
}
