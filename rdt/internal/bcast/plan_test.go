package bcast

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// The tree, from the topology alone: the owner's host first, then hosts by
// distance (same rack before others, then by name), one leader a host on
// the chain of hosts, the rest of a host behind its leader in device order.
func TestPlanTree(t *testing.T) {
	cl, err := topology.Preset("dgx-h100", 4)
	require.NoError(t, err)
	racks := map[string]string{"h0": "rackA", "h1": "rackB", "h2": "rackA", "h3": "rackB"}
	for _, h := range cl.Hosts {
		h.Labels[topology.LabelRack] = racks[h.ID]
	}
	ep := func(host string, dev int) fabric.Endpoint {
		return fabric.Endpoint{Host: host, Device: tensor.GPUDevice(dev)}
	}
	readers := []fabric.Endpoint{ep("h1", 0), ep("h3", 1), ep("h2", 0), ep("h3", 0), ep("h2", 1), ep("h0", 1)}
	var edges []string
	plan := PlanTree(cl, ep("h0", 0), readers, func(parent, child int) string {
		edges = append(edges, fmt.Sprintf("%d>%d", parent, child))
		return fmt.Sprintf("e%d", child)
	})
	t.Logf("\n%s", plan)
	parents := make([]int, len(plan.Nodes))
	for i, n := range plan.Nodes {
		parents[i] = n.Parent
		assert.Equal(t, fmt.Sprintf("e%d", i), n.Path, "each edge's path is asked once, for its own child")
	}
	assert.Equal(t, []int{2, 3, -1, 0, 2, -1}, parents)
	assert.Equal(t, []bool{true, false, true, true, false, false}, []bool{plan.Nodes[0].Leader, plan.Nodes[1].Leader, plan.Nodes[2].Leader, plan.Nodes[3].Leader, plan.Nodes[4].Leader, plan.Nodes[5].Leader},
		"one leader per remote host; the owner's host has none")
	assert.Equal(t, []string{"2>0", "3>1", "-1>2", "0>3", "2>4", "-1>5"}, edges)
	assert.Equal(t, "h0/gpu:0", plan.Owner)
	assert.Equal(t, "h2/gpu:1", plan.Nodes[4].Endpoint)
}

// Hosts the cluster does not know rank last, by name; no readers plan an
// empty tree.
func TestPlanTreeUnknownHosts(t *testing.T) {
	none := func(int, int) string { return "none" }
	plan := PlanTree(nil, fabric.Endpoint{Host: "a", Device: tensor.HostDevice}, []fabric.Endpoint{{Host: "z", Device: tensor.HostDevice}, {Host: "a", Device: tensor.HostDevice}, {Host: "m", Device: tensor.HostDevice}}, none)
	assert.Equal(t, []Node{{Endpoint: "z/cpu:0", Parent: 2, Path: "none", Leader: true}, {Endpoint: "a/cpu:0", Parent: -1, Path: "none"}, {Endpoint: "m/cpu:0", Parent: -1, Path: "none", Leader: true}}, plan.Nodes)
	assert.Empty(t, PlanTree(nil, fabric.Endpoint{Host: "a"}, nil, none).Nodes)
}

func TestConfigDefaults(t *testing.T) {
	d := Config{}.Defaults()
	assert.Equal(t, Config{ChunkSize: DefaultChunk, BusyWait: DefaultBusyWait, Window: DefaultWindow}, d)
	set := Config{ChunkSize: MinChunk, BusyWait: 1, Window: 2}
	assert.Equal(t, set, set.Defaults(), "set fields are kept")
	assert.Equal(t, -1, Config{Window: -1}.Defaults().Window, "a bad window is left for the caller to refuse")
}
