// Package bcast holds the parts of rdt's broadcast (one object written to
// many readers' slots along a tree, pipelined in chunks) that need no
// runtime: its configuration, the tree planner, the window of chunk writes
// each edge keeps in flight, and its metrics.
//
// The seam to rdt is deliberately narrow: the planner takes endpoints (host
// and device) and a function naming the transport of an edge, the window
// takes write functions, and the metrics take a Prometheus registerer. The
// parts that do need a runtime (the owner's run of a broadcast, the
// readers' relays, the notices between them) stay in rdt, where the slots,
// refs and the notice streams they use are; rdt re-exports Config and Plan
// as BroadcastConfig and BroadcastPlan, so its public API is unchanged.
//
// It must not import rdt (archtest: internal packages of rdt sit below it).
package bcast
