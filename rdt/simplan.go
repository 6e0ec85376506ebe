package rdt

import (
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/rdt/internal/bcast"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// PlanBroadcastTree is the tree Broadcast would follow from an object on
// owner to readers (slots on those host/device endpoints), computed from
// the topology alone, with no runtime: the same planner (bcast.PlanTree)
// that Broadcast and ExplainBroadcast run, for simulators and capacity
// planning (package fabricsim executes it against simulated links).
// PlanNode.Path is "none" here, since no transport runs: the caller asks
// a fabric.Planner for each edge. It fails with ErrUnknownDevice when an
// endpoint names a host or device the cluster does not have.
func PlanBroadcastTree(c *topology.Cluster, owner topology.Endpoint, readers []topology.Endpoint) (BroadcastPlan, error) {
	ep := func(e topology.Endpoint) (fabric.Endpoint, error) {
		h, ok := c.Host(e.Host)
		if !ok {
			return fabric.Endpoint{}, fmt.Errorf("%w: host %q is not in the cluster", ErrUnknownDevice, e.Host)
		}
		if e.Device == topology.HostMemory {
			return fabric.Endpoint{Host: e.Host, Device: tensor.HostDevice}, nil
		}
		d, ok := h.Device(e.Device)
		if !ok {
			return fabric.Endpoint{}, fmt.Errorf("%w: host %q has no device %d", ErrUnknownDevice, e.Host, e.Device)
		}
		return fabric.Endpoint{Host: e.Host, Device: tensor.DeviceID{Kind: tensor.DeviceKind(d.Kind), Index: e.Device}}, nil
	}
	o, err := ep(owner)
	if err != nil {
		return BroadcastPlan{}, err
	}
	eps := make([]fabric.Endpoint, len(readers))
	for i, e := range readers {
		if eps[i], err = ep(e); err != nil {
			return BroadcastPlan{}, err
		}
	}
	return bcast.PlanTree(c, o, eps, func(int, int) string { return "none" }), nil
}
