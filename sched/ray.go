package sched

import (
	"fmt"
	"sort"

	"github.com/tensorlane/tensorlane/topology"
)

// LabelHost is the node label a Ray node must carry (set to the tensorlane
// host ID it runs on) for a pinned export to land where the placement
// says: Ray schedules the bundles, the label selector holds each one to
// its host.
const LabelHost = "tensorlane.io/host"

// RayPlacementGroup is a Ray placement-group spec in the shape of
// ray.util.placement_group's arguments: bundles as resource dicts, the
// strategy, and one label selector per bundle.
type RayPlacementGroup struct {
	Name                string               `json:"name,omitempty"`
	Strategy            string               `json:"strategy"`
	Bundles             []map[string]float64 `json:"bundles"`
	BundleLabelSelector []map[string]string  `json:"bundle_label_selector,omitempty"`
}

// rayLabel maps selector keys to the labels Ray nodes carry.
var rayLabel = map[string]string{
	"accelerator":             "ray.io/accelerator-type",
	topology.LabelAccelerator: "ray.io/accelerator-type",
	"zone":                    "ray.io/availability-zone",
	topology.LabelZone:        "ray.io/availability-zone",
	"slice":                   "ray.io/tpu-slice-name",
	topology.LabelSlice:       "ray.io/tpu-slice-name",
	"host":                    LabelHost,
	"rack":                    topology.LabelRack,
	"block":                   topology.LabelBlock,
	"nvlink-domain":           topology.LabelNVLinkDomain,
}

func rayResource(k topology.DeviceKind) string {
	switch k {
	case topology.KindTPU:
		return "TPU"
	case topology.KindNeuron:
		return "neuron_cores"
	case topology.KindHPU:
		return "HPU"
	}
	return "GPU"
}

// RaySpec exports a request as a Ray placement group. When p is a feasible
// placement of req, every bundle's selector also pins it to its host
// (LabelHost), so Ray reproduces the placement; otherwise the bundles
// carry only the request's own selectors. A bundle of kind "" asks Ray
// for GPUs.
func RaySpec(req Request, p Placement) (RayPlacementGroup, error) {
	cr, err := compile(req)
	if err != nil {
		return RayPlacementGroup{}, err
	}
	pin := map[int]string{}
	if p.Feasible {
		if len(p.Assignments) != len(cr.bundles) {
			return RayPlacementGroup{}, fmt.Errorf("%w: placement has %d assignments for %d bundles", ErrInvalidRequest, len(p.Assignments), len(cr.bundles))
		}
		for _, a := range p.Assignments {
			pin[a.Bundle] = a.Host
		}
	}
	out := RayPlacementGroup{Name: req.Name, Strategy: string(cr.strategy)}
	anySel := false
	for i, b := range cr.bundles {
		res := map[string]float64{}
		if b.devices > 0 {
			res[rayResource(b.kind)] = float64(b.devices)
		} else if b.memBytes > 0 {
			res["memory"] = float64(b.memBytes)
		}
		if b.CPUs > 0 {
			res["CPU"] = b.CPUs
		}
		out.Bundles = append(out.Bundles, res)
		sel := map[string]string{}
		keys := make([]string, 0, len(b.Selector))
		for k := range b.Selector {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			rk := k
			if m, ok := rayLabel[k]; ok {
				rk = m
			}
			sel[rk] = b.Selector[k]
		}
		if h, ok := pin[i]; ok {
			sel[LabelHost] = h
		}
		if len(sel) > 0 {
			anySel = true
		}
		out.BundleLabelSelector = append(out.BundleLabelSelector, sel)
	}
	if !anySel {
		out.BundleLabelSelector = nil
	}
	return out, nil
}
