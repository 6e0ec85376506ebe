// Package fabricsim is a flow-level simulator of the fabric between
// accelerators, for sizes this project cannot rent: it runs tensorlane's
// own plans at 100k GPUs and says how long they take next to the
// line-rate bound.
//
// A Fabric is built from a topology.Cluster and a Spec: per device a PCIe
// link each way and, where the topology has device links, an NVLink (or
// xGMI, ICI...) port each way; per PCIe switch an uplink each way; per NIC
// a rail each way; per leaf group and rail a leaf switch whose uplinks
// carry the group's line rate over the Spec's oversubscription; a memcpy
// link per host for shm and for simulated arenas. Transfers move as flows
// over paths of links, sharing every link max-min fairly, in an event loop
// with the latencies and per-message costs of the Spec (measured here:
// docs/sim.md).
//
// What runs is tensorlane's code, not a second model of it: every
// transfer's path is fabric.Planner's BestAllowed (the choice a runtime
// with every transport makes), an rdma transfer is striped over the
// owner's rails nearest its device first, paired by name as the rdma
// transport pairs them; a broadcast follows the tree rdt plans
// (rdt.PlanBroadcastTree runs Broadcast's planBroadcast) with its chunks
// and window (rdt.BroadcastConfig.Defaults); a weight sync is GetBatch's
// plan, each reader fetching every owner's pieces at once as one
// coalesced read. Each Result carries the line-rate bound, the bytes that
// must cross the narrowest cut (a host's NICs, a leaf group's uplinks)
// over its aggregate line rate, and the ratio to it.
//
// `tensorlane sim` is the command-line front; internal/multihost's
// side-by-side test checks the simulator against runs on real network
// namespaces.
package fabricsim
