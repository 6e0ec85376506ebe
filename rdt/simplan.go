package rdt

import (
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// PlanBroadcastTree is the tree Broadcast would follow from an object on
// owner to readers (slots on those host/device endpoints), computed from
// the topology alone, with no runtime: the same planBroadcast that
// Broadcast and ExplainBroadcast run, for simulators and capacity
// planning (package fabricsim executes it against simulated links).
// PlanNode.Path is "none" here, since no transport runs: the caller asks
// a fabric.Planner for each edge. It fails with ErrUnknownDevice when an
// endpoint names a host or device the cluster does not have.
func PlanBroadcastTree(c *topology.Cluster, owner topology.Endpoint, readers []topology.Endpoint) (BroadcastPlan, error) {
	kinds := map[topology.Endpoint]tensor.DeviceKind{}
	for _, e := range append([]topology.Endpoint{owner}, readers...) {
		h, ok := c.Host(e.Host)
		if !ok {
			return BroadcastPlan{}, fmt.Errorf("%w: host %q is not in the cluster", ErrUnknownDevice, e.Host)
		}
		if e.Device == topology.HostMemory {
			continue
		}
		d, ok := h.Device(e.Device)
		if !ok {
			return BroadcastPlan{}, fmt.Errorf("%w: host %q has no device %d", ErrUnknownDevice, e.Host, e.Device)
		}
		kinds[e] = tensor.DeviceKind(d.Kind)
	}
	pl, err := fabric.NewPlanner(fabric.PlannerConfig{Topology: c})
	if err != nil {
		return BroadcastPlan{}, err
	}
	r := &Runtime{cfg: Config{Cluster: c}, planner: pl}
	ref := func(e topology.Endpoint) Ref {
		d := tensor.HostDevice
		if e.Device != topology.HostMemory {
			d = tensor.DeviceID{Kind: kinds[e], Index: e.Device}
		}
		return Ref{Host: e.Host, Device: d}
	}
	slots := make([]Ref, len(readers))
	for i, e := range readers {
		slots[i] = ref(e)
	}
	return r.planBroadcast(ref(owner), slots), nil
}

// Defaults returns c with every zero field set to its documented default,
// as Broadcast uses it (a simulator executes the same chunks and window).
func (c BroadcastConfig) Defaults() BroadcastConfig { return c.withDefaults() }
