package sched

import (
	"github.com/tensorlane/tensorlane/topology"
)

// The cost model charges every transfer to the resources it crosses: a
// device's NVLink (or ICI) ports, its PCIe port, a host's socket link and
// memory, a NIC. A resource is busy for volume/bandwidth seconds per
// transfer; the estimated time of a traffic matrix is the busiest
// resource's total, which is the step time if everything that can overlap
// does. Traffic between two bundles is striped over max(devices) device
// pairs (device i of one with device i mod n of the other).

type resKind uint8

const (
	resNVOut resKind = iota
	resNVIn
	resPCIeOut
	resPCIeIn
	resSMP
	resHostMem
	resNICOut
	resNICIn
)

// resKey packs (host, unit, kind) into one word: loads are kept in maps
// keyed by it, and a word hashes much faster than a padded struct.
type resKey uint64

func rk(host, unit int32, kind resKind) resKey {
	return resKey(uint64(uint32(host))<<32 | uint64(uint32(unit)&0xffffff)<<8 | uint64(kind))
}

// charge is one resource's share of a transfer.
type charge struct {
	key resKey
	t   float64
}

// endpoint of a transfer: a host and a device position, or -1 for host memory.
type xend struct {
	host, dev int
}

// pairCharges appends the charges of moving gb gigabytes from a to b.
func (ix *index) pairCharges(out []charge, a, b xend, gb float64) []charge {
	if gb <= 0 {
		return out
	}
	ha, hb := &ix.hosts[a.host], &ix.hosts[b.host]
	if a.host == b.host {
		if a.dev == b.dev {
			if a.dev < 0 {
				return append(out, charge{rk(int32(a.host), 0, resHostMem), gb / ix.cost.PHB})
			}
			return out
		}
		if a.dev < 0 || b.dev < 0 {
			t := gb / ix.cost.PHB
			out = append(out, charge{rk(int32(a.host), 0, resHostMem), t})
			if a.dev >= 0 {
				out = append(out, charge{rk(int32(a.host), int32(a.dev), resPCIeOut), t})
			}
			if b.dev >= 0 {
				out = append(out, charge{rk(int32(b.host), int32(b.dev), resPCIeIn), t})
			}
			return out
		}
		p := ha.pair[a.dev][b.dev]
		t := gb / p.gbps
		if p.class == topology.PathNV {
			return append(out, charge{rk(int32(a.host), int32(a.dev), resNVOut), t}, charge{rk(int32(b.host), int32(b.dev), resNVIn), t})
		}
		out = append(out, charge{rk(int32(a.host), int32(a.dev), resPCIeOut), t}, charge{rk(int32(b.host), int32(b.dev), resPCIeIn), t})
		if p.class == topology.PathSYS {
			out = append(out, charge{rk(int32(a.host), 0, resSMP), t})
		}
		return out
	}
	if a.dev >= 0 && b.dev >= 0 {
		bw := 0.0
		switch {
		case ix.labelled[rankNVLink] && ha.group[rankNVLink] == hb.group[rankNVLink]:
			bw = ix.cost.MNNVL
		case ix.labelled[rankSlice] && ha.group[rankSlice] == hb.group[rankSlice]:
			bw = ix.cost.Slice
		}
		if bw > 0 {
			t := gb / bw
			return append(out, charge{rk(int32(a.host), int32(a.dev), resNVOut), t}, charge{rk(int32(b.host), int32(b.dev), resNVIn), t})
		}
	}
	nicA, netA := ha.hostNIC, ha.hostNet
	if a.dev >= 0 {
		nicA, netA = ha.devs[a.dev].nic, ha.devs[a.dev].net
	}
	nicB, netB := hb.hostNIC, hb.hostNet
	if b.dev >= 0 {
		nicB, netB = hb.devs[b.dev].nic, hb.devs[b.dev].net
	}
	t := gb / min(netA, netB)
	out = append(out, charge{rk(int32(a.host), int32(nicA), resNICOut), t}, charge{rk(int32(b.host), int32(nicB), resNICIn), t})
	// The bytes also cross each device's PCIe port (GPUDirect RDMA).
	if a.dev >= 0 {
		out = append(out, charge{rk(int32(a.host), int32(a.dev), resPCIeOut), gb / ix.cost.PIX})
	}
	if b.dev >= 0 {
		out = append(out, charge{rk(int32(b.host), int32(b.dev), resPCIeIn), gb / ix.cost.PIX})
	}
	return out
}

// edgeCharges appends the charges of one traffic edge between two placed
// bundles (host, device positions).
func (ix *index) edgeCharges(out []charge, ha int, da []int, hb int, db []int, gb float64) []charge {
	k := max(len(da), len(db), 1)
	per := gb / float64(k)
	for j := 0; j < k; j++ {
		a, b := xend{ha, -1}, xend{hb, -1}
		if len(da) > 0 {
			a.dev = da[j%len(da)]
		}
		if len(db) > 0 {
			b.dev = db[j%len(db)]
		}
		out = ix.pairCharges(out, a, b, per)
	}
	return out
}

// Estimate returns the cost model's estimated seconds for one step of the
// request's traffic under the given assignments (one per bundle, as a
// Placement holds them). It reports false when an assignment names an
// unknown host or device or a bundle is missing.
func (s *Scheduler) Estimate(req Request, as []Assignment) (float64, bool) {
	cr, err := compile(req)
	if err != nil || len(as) != len(cr.bundles) {
		return 0, false
	}
	hosts := make([]int, len(as))
	devs := make([][]int, len(as))
	for _, a := range as {
		if a.Bundle < 0 || a.Bundle >= len(as) {
			return 0, false
		}
		h, ok := s.ix.byID[a.Host]
		if !ok {
			return 0, false
		}
		hosts[a.Bundle] = h
		for _, d := range a.Devices {
			p, ok := s.ix.hosts[h].pos[d]
			if !ok {
				return 0, false
			}
			devs[a.Bundle] = append(devs[a.Bundle], p)
		}
	}
	return s.ix.estimate(cr, hosts, devs), true
}

func (ix *index) estimate(cr *creq, hosts []int, devs [][]int) float64 {
	loads := map[resKey]float64{}
	var buf []charge
	for _, e := range cr.edges {
		buf = ix.edgeCharges(buf[:0], hosts[e.from], devs[e.from], hosts[e.to], devs[e.to], e.gb)
		for _, c := range buf {
			loads[c.key] += c.t
		}
	}
	m := 0.0
	for _, v := range loads {
		m = max(m, v)
	}
	return m
}
