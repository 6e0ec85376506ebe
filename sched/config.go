package sched

import (
	"fmt"
	"math"
)

// Config tunes the scheduler. Its zero value means the documented defaults.
type Config struct {
	// Cost is the bandwidth table the cost model charges transfers with.
	Cost CostModel
	// Candidates is how many groups per topology level the search tries
	// (best first by the anti-fragmentation order) before it stops
	// looking; 0 means 4.
	Candidates int
	// LocalSearch is the largest gang (in bundles) that gets the move and
	// swap improvement pass after the greedy placement; 0 means 64, a
	// negative value turns the pass off.
	LocalSearch int

	// noPartition turns the partition start off (tests compare with it).
	noPartition bool
	// noShapes gives every host a shape of its own: no shared host
	// tables and no skipping of clean hosts in the candidate scan
	// (tests compare with it).
	noShapes bool
}

// CostModel is the scheduler's own, deliberately small, bandwidth table:
// unidirectional GB/s that one device pair gets on a path class. It does
// not depend on the fabric package; the figures are rough effective rates,
// good for ranking placements, not for predicting a benchmark. Zero fields
// mean the defaults given here.
type CostModel struct {
	// NV: a direct device link when the topology gives no bandwidth
	// (links normally carry their GBps, which wins). Default 300.
	NV float64
	// PCIe classes within a host: PIX 55, PXB 52, PHB 50, NODE 40, SYS 25
	// (PCIe 5 x16 peer copies through one switch down to across sockets).
	// Host memory endpoints are charged at PHB, and a device's network
	// traffic also at PIX on its PCIe port.
	PIX, PXB, PHB, NODE, SYS float64
	// MNNVL: GPUs of different hosts in one multi-node NVLink domain
	// (GB200 NVL72: 900 GB/s per GPU each way). Default 900.
	MNNVL float64
	// Slice: TPU chips of different hosts of one slice, reached over ICI
	// (topology reports NET for them; one v5p ICI link is 50 GB/s each
	// way). Default 50.
	Slice float64
	// NET: different hosts over the network. A device uses its nearest
	// RDMA NIC at RDMAEfficiency of the NIC's speed (default 0.9); the
	// pair gets the slower end. NICs without RDMA, and hosts without NICs
	// (at DefaultNICGbps, default 100), get TCPEfficiency of their speed
	// (default 0.5). A NIC on another PCIe switch of the same NUMA node
	// gives NICSameNUMA of that (default 0.8), one across sockets
	// NICRemoteNUMA (default 0.5).
	DefaultNICGbps, RDMAEfficiency, TCPEfficiency, NICSameNUMA, NICRemoteNUMA float64
}

// DefaultCostModel returns the table a zero CostModel stands for.
func DefaultCostModel() CostModel {
	return CostModel{
		NV: 300, PIX: 55, PXB: 52, PHB: 50, NODE: 40, SYS: 25,
		MNNVL: 900, Slice: 50,
		DefaultNICGbps: 100, RDMAEfficiency: 0.9, TCPEfficiency: 0.5, NICSameNUMA: 0.8, NICRemoteNUMA: 0.5,
	}
}

func (m CostModel) withDefaults() (CostModel, error) {
	d := DefaultCostModel()
	fields := []struct {
		name string
		v    *float64
		def  float64
		frac bool
	}{
		{"NV", &m.NV, d.NV, false}, {"PIX", &m.PIX, d.PIX, false}, {"PXB", &m.PXB, d.PXB, false},
		{"PHB", &m.PHB, d.PHB, false}, {"NODE", &m.NODE, d.NODE, false}, {"SYS", &m.SYS, d.SYS, false},
		{"MNNVL", &m.MNNVL, d.MNNVL, false}, {"Slice", &m.Slice, d.Slice, false},
		{"DefaultNICGbps", &m.DefaultNICGbps, d.DefaultNICGbps, false},
		{"RDMAEfficiency", &m.RDMAEfficiency, d.RDMAEfficiency, true},
		{"TCPEfficiency", &m.TCPEfficiency, d.TCPEfficiency, true},
		{"NICSameNUMA", &m.NICSameNUMA, d.NICSameNUMA, true},
		{"NICRemoteNUMA", &m.NICRemoteNUMA, d.NICRemoteNUMA, true},
	}
	for _, f := range fields {
		v := *f.v
		if math.IsNaN(v) || math.IsInf(v, 0) || v < 0 || (f.frac && v > 1) {
			return m, fmt.Errorf("%w: Cost.%s = %v", ErrInvalidConfig, f.name, v)
		}
		if v == 0 {
			*f.v = f.def
		}
	}
	return m, nil
}

func (c Config) withDefaults() (Config, error) {
	var err error
	if c.Cost, err = c.Cost.withDefaults(); err != nil {
		return c, err
	}
	if c.Candidates < 0 {
		return c, fmt.Errorf("%w: Candidates = %d", ErrInvalidConfig, c.Candidates)
	}
	if c.Candidates == 0 {
		c.Candidates = 4
	}
	if c.LocalSearch == 0 {
		c.LocalSearch = 64
	}
	return c, nil
}
