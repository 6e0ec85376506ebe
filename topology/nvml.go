package topology

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// What NVML says of one GPU, reduced to what the topology needs. The live
// reader (nvml_cgo.go, NVIDIA/go-nvml over a dlopen of libnvidia-ml) fills
// it; tests feed recorded answers through the same mapping.
type nvmlGPU struct {
	BusID  string // NVML form, e.g. "00000000:18:00.0"
	UUID   string
	Links  []nvmlLink // active NVLinks only
	Fabric nvmlFabric
}

type nvmlLink struct {
	RemoteBusID string
	ToSwitch    bool // the far end is an NVSwitch, not a GPU
}

// nvmlFabric is the GPU's multi-node NVLink fabric registration (GB200
// NVL72 and later); Cluster is empty when the GPU is in no fabric.
type nvmlFabric struct {
	Cluster string // cluster UUID, hex
	Clique  uint32
}

// nvmlReader returns every GPU NVML sees, or an error wrapping
// errNVMLUnavailable when the library cannot be used here.
type nvmlReader func() ([]nvmlGPU, error)

var errNVMLUnavailable = errors.New("NVML unavailable")

// normalBusID turns NVML's and sysfs's spellings of a PCI address into one:
// NVML pads the domain to 8 digits and may use upper case.
func normalBusID(s string) string {
	s = strings.ToLower(strings.TrimSpace(s))
	dom, rest, ok := strings.Cut(s, ":")
	if !ok || strings.Count(rest, ":") != 1 {
		return s
	}
	d, err := strconv.ParseUint(dom, 16, 32)
	if err != nil {
		return s
	}
	return fmt.Sprintf("%04x:%s", d, rest)
}

// applyNVML adds what NVML knows to the devices the PCI scan found (idx,
// with their functions fns and chip defaults infos): UUIDs, NVLinks counted
// per pair (GPUs that reach each other through NVSwitches are all-to-all,
// with as many lanes as the fewer switch links of the two), and the fabric
// cluster and clique that mark a multi-node NVLink domain. It reports
// whether NVML described the NVLinks, so the caller need not infer them.
func applyNVML(s *Scan, idx []int, fns []PCIFunction, infos []chipInfo, gpus []nvmlGPU) (linksKnown bool) {
	byBus := map[string]int{} // bus id -> position in idx
	for k, fn := range fns {
		byBus[normalBusID(fn.Address)] = k
	}
	direct := map[[2]int]int{} // pair of positions -> lanes
	switchLanes := map[int]int{}
	var fabrics []nvmlFabric
	for _, g := range gpus {
		k, ok := byBus[normalBusID(g.BusID)]
		if !ok {
			s.Warn("", "NVML reports GPU %s at %s, which the PCI scan did not find", g.UUID, g.BusID)
			continue
		}
		d := &s.Host.Devices[idx[k]]
		if g.UUID != "" {
			d.UUID = g.UUID
		}
		if g.Fabric.Cluster != "" {
			d.Fabric = fmt.Sprintf("%s/%d", g.Fabric.Cluster, g.Fabric.Clique)
			fabrics = append(fabrics, g.Fabric)
		}
		for _, l := range g.Links {
			if l.ToSwitch {
				switchLanes[k]++
				continue
			}
			peer, ok := byBus[normalBusID(l.RemoteBusID)]
			if !ok || peer == k {
				continue
			}
			// Each direct link is seen from both ends; count it once.
			if k < peer {
				direct[[2]int{k, peer}]++
			}
		}
	}
	perLane := func(k int) float64 {
		if infos[k].lanes == 0 {
			return 0
		}
		return infos[k].gbps / float64(infos[k].lanes)
	}
	for a := range idx {
		for b := a + 1; b < len(idx); b++ {
			lanes := direct[[2]int{a, b}]
			if sa, sb := switchLanes[a], switchLanes[b]; sa > 0 && sb > 0 {
				lanes += min(sa, sb)
			}
			if lanes == 0 {
				continue
			}
			s.AddLink(Link{A: idx[a], B: idx[b], Kind: LinkNVLink, Lanes: lanes, GBps: float64(lanes) * min(perLane(a), perLane(b))})
			linksKnown = true
		}
	}
	if len(gpus) > 0 && len(switchLanes) == 0 && len(direct) == 0 {
		linksKnown = true // NVML answered: these GPUs have no active NVLink
	}
	if len(fabrics) > 0 {
		f := fabrics[0]
		same := len(fabrics) == len(idx)
		for _, g := range fabrics {
			same = same && g == f
		}
		if same {
			// Hosts whose GPUs share a fabric cluster and clique are one
			// NVLink domain, as NCCL's multi-node NVLink detection has it.
			s.SetLabel(LabelNVLinkDomain, fmt.Sprintf("nvl-%s-%d", f.Cluster, f.Clique))
		} else {
			s.Warn("", "GPUs of this host report different NVLink fabric cliques; no NVLink domain set")
		}
	}
	return linksKnown
}
