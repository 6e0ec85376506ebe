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

// HarnessBurst is the token bucket of a shaped harness link: tbf's burst
// as internal/netns sets it (512kb: tc's kb is 1,024 bytes).
const HarnessBurst = 512 << 10

// HarnessQueueSeconds is the most a shaped harness link was seen to
// queue, in seconds of its rate: tbf's latency (100ms, as internal/netns
// sets it) lets it hold 12.5 MB, but TCP (BBR here, paced, with TCP small
// queues) never fills it. `tc -s qdisc` sampled every 2 ms through 16
// broadcasts of 64 MiB in 4 MiB chunks, windows 1-8, 1 and 3 readers
// (TestSimQueueBacklog), showed at most 3.05 MB of backlog on the owner's
// and the first relay's link: 24 ms at 1 Gbit/s. The queue the notices
// wait in is that, not tbf's limit.
const HarnessQueueSeconds = 0.024

// HarnessCluster is the multihost harness's machine: hosts dgx-h100 hosts
// (each a network namespace with one `tensorlane worker`), whose NICs are
// replaced by rails veths shaped to gbit Gbit/s each way, all on one
// bridge (one leaf), sharing the cores of the machine that took the
// committed calibration (HarnessCalibration).
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
		// internal/netns shapes with tbf and a 512 KiB burst.
		Burst: HarnessBurst,
		// and 100ms of latency, of which TCP fills about a quarter
		// (HarnessQueueSeconds); the runtimes' control streams queue
		// in it behind the data.
		QueueSeconds: HarnessQueueSeconds,
		// The harness's hosts are namespaces of one machine: they share
		// its cores, at the costs the machine measured of itself.
		CPU: HarnessCalibration().CPU(),
	}
	return c, spec, nil
}
