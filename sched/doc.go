// Package sched is tensorlane's placement scheduler: it puts a gang of
// bundles (actors with their devices) onto the devices of a
// topology.Cluster so that the traffic between them takes the best links,
// and it explains itself.
//
// A Request is placed all-or-nothing. Strategies follow Ray placement
// groups (PACK, SPREAD, STRICT_PACK, STRICT_SPREAD); Topology confines the
// gang to one group of a level (numa < host < nvlink-domain < slice < rack
// < block < zone): Required must hold, Preferred climbs level by level
// until the gang fits, as Kueue's topology-aware scheduling does. A
// bundle's devices come from one host, from one PCIe switch or NUMA node
// where possible; NICAffinity requires an RDMA NIC beside every device.
//
// The traffic matrix drives the search. The cost model (CostModel, a small
// bandwidth table per path class: NVLink, PCIe classes, multi-node NVLink,
// TPU slice ICI, the network at NIC speed) charges each transfer to the
// device ports, PCIe ports and NICs it crosses; the estimated step time is
// the busiest resource's total. The search tries groups of the required
// level in anti-fragmentation order (partly used groups first, then the
// tightest fit, so whole NVLink domains, racks and slices stay free), within
// each the preferred (or, with traffic, every smaller) level. In each it
// builds two placements: a greedy one (bundles in maximum-adjacency order,
// each on the host that adds the least cost) and, where the group spans
// several NVLink domains, slices or hosts, a partition one (the traffic
// graph clustered, most strongly linked first, into components that fit a
// domain, each component placed whole into its cheapest domain, split at
// its last merge only when no domain holds it; small gangs try two
// linkage rules). Small gangs are then
// improved by moves, swaps and evictions (a bundle joins its peer's host
// by pushing another bundle out), and the cheapest placement wins.
//
// Decisions are a deterministic function of (cluster, state, request,
// Config): no clock, no randomness, no map order. A Scheduler keeps the
// state (reservations, failed hosts and devices), reschedules the bundles a
// failure hits, and exports State as JSON. An infeasible request returns an
// *InfeasibleError listing every reason ("needs 8 GPUs in one NVLink
// domain; the largest free has 6"). RaySpec exports a placement as a Ray
// placement group. Each Assignment names a host ID and device indices, so
// the runtime that claimed the host can spawn the actor there
// (rdt/placement.Spawn does, for a whole placement, all-or-nothing).
//
// sched imports only topology; its cost model is its own, independent of
// the fabric package's planner.
package sched
