package bcast

import (
	"fmt"
	"sort"
	"strings"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/topology"
)

// Plan is the tree a broadcast follows (rdt re-exports it as
// BroadcastPlan).
type Plan struct {
	Owner string // the owner's endpoint
	Nodes []Node
}

// Node is one reader in the tree (rdt re-exports it as PlanNode).
type Node struct {
	Endpoint string // host/device of the slot
	Parent   int    // -1: the owner
	Path     string // the transport from its parent
	Leader   bool   // the first reader of its host, fed across hosts
}

// String draws the tree, one reader a line, children indented under their
// parent.
func (p Plan) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "owner %s\n", p.Owner)
	var walk func(parent, depth int)
	walk = func(parent, depth int) {
		for i, n := range p.Nodes {
			if n.Parent != parent {
				continue
			}
			role := ""
			if n.Leader {
				role = " (host leader)"
			}
			fmt.Fprintf(&b, "%s└─ reader %d %s via %s%s\n", strings.Repeat("   ", depth), i, n.Endpoint, n.Path, role)
			walk(i, depth+1)
		}
	}
	walk(-1, 0)
	return b.String()
}

// EdgePath names the transport of the edge from parent (-1: the owner) to
// reader child, indexes into the readers given to PlanTree. A runtime asks
// its planner what the relay's write would run; a simulator with no
// transports says "none".
type EdgePath func(parent, child int) string

// PlanTree orders the readers of a broadcast from owner: hosts nearest the
// owner in c first (same NVLink domain, then same rack, then by name), one
// leader per host fed along the chain of hosts, the others chained behind
// their leader (a reader on the owner's host hangs off the owner). It is a
// pure function of its arguments; path names each edge's transport.
func PlanTree(c *topology.Cluster, owner fabric.Endpoint, readers []fabric.Endpoint, path EdgePath) Plan {
	plan := Plan{Owner: owner.Host + "/" + owner.Device.String(), Nodes: make([]Node, len(readers))}
	byHost := map[string][]int{}
	var hosts []string
	for i, s := range readers {
		if _, ok := byHost[s.Host]; !ok {
			hosts = append(hosts, s.Host)
		}
		byHost[s.Host] = append(byHost[s.Host], i)
	}
	rank := func(h string) int {
		if h == owner.Host {
			return 0
		}
		return 1 + hostDistance(c, owner.Host, h)
	}
	sort.SliceStable(hosts, func(i, j int) bool {
		ri, rj := rank(hosts[i]), rank(hosts[j])
		if ri != rj {
			return ri < rj
		}
		return hosts[i] < hosts[j]
	})
	prevLeader := -1
	for _, h := range hosts {
		members := byHost[h]
		// Within a host, a reader on the owner's own device, then by device.
		sort.SliceStable(members, func(i, j int) bool {
			return readers[members[i]].Device.String() < readers[members[j]].Device.String()
		})
		from := prevLeader
		for k, m := range members {
			plan.Nodes[m] = Node{Endpoint: h + "/" + readers[m].Device.String(), Parent: from, Leader: k == 0}
			if k == 0 && h != owner.Host {
				prevLeader = m
			}
			from = m
		}
		if h == owner.Host {
			plan.Nodes[members[0]].Leader = false
		}
	}
	for i := range plan.Nodes {
		plan.Nodes[i].Path = path(plan.Nodes[i].Parent, i)
	}
	return plan
}

// hostDistance ranks how far host b is from a: 0 in one NVLink domain,
// 1 in one rack, 2 otherwise, 3 when either is not in c.
func hostDistance(c *topology.Cluster, a, b string) int {
	ha, ok1 := c.Host(a)
	hb, ok2 := c.Host(b)
	if !ok1 || !ok2 {
		return 3
	}
	same := func(k string) bool { v := ha.Labels[k]; return v != "" && v == hb.Labels[k] }
	switch {
	case same(topology.LabelNVLinkDomain):
		return 0
	case same(topology.LabelRack):
		return 1
	}
	return 2
}
