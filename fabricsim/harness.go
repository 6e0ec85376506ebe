package fabricsim

import (
	"fmt"

	"github.com/tensorlane/tensorlane/topology"
)

// HarnessWireEfficiency is the payload share of a shaped veth's rate in
// the multihost harness: tc shapes Ethernet frames, and a full frame of
// 1,514 bytes carries 1,448 bytes of TCP payload (20 bytes of IP, 32 of
// TCP with timestamps, 14 of Ethernet); softrdma runs over TCP too. It
// comes from the header sizes, not from fitting the measurements.
const HarnessWireEfficiency = 1448.0 / 1514.0

// HarnessCluster is the multihost harness's machine: hosts dgx-h100 hosts
// (each a network namespace with one `tensorlane worker`), whose NICs are
// replaced by rails veths shaped to gbit Gbit/s each way, all on one
// bridge (one leaf).
func HarnessCluster(hosts, rails int, gbit float64) (*topology.Cluster, Spec, error) {
	if hosts < 1 || rails < 1 || gbit <= 0 {
		return nil, Spec{}, fmt.Errorf("%w: harness of %d hosts, %d rails at %g Gbit/s", ErrBadSpec, hosts, rails, gbit)
	}
	c, err := topology.PresetCluster("dgx-h100", hosts, 0)
	if err != nil {
		return nil, Spec{}, err
	}
	for _, h := range c.Hosts {
		h.NICs = nil
		for k := range rails {
			h.NICs = append(h.NICs, topology.NIC{Name: fmt.Sprintf("veth%d", k), RDMADevice: fmt.Sprintf("soft%d", k), SpeedGbps: gbit, NUMA: 0})
		}
	}
	spec := Spec{
		HostsPerLeaf:   hosts,
		RDMAEfficiency: HarnessWireEfficiency,
		TCPEfficiency:  HarnessWireEfficiency,
		Arenas:         true,
		ProcessPerHost: true,
	}
	return c, spec, nil
}
