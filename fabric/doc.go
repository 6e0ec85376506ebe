// Package fabric is how bytes move between tensorlane runtimes.
//
// A Transport reads an object's bytes from its owner into a reader's buffer;
// a Writer also pushes them into a buffer the reader reserved (its Sink).
// Each implementation lives in a sub-package: fabric/local (same process:
// zero-copy views and device-to-device copies), fabric/shm (another process
// of the same host: the owner's memory mapped through a passed memfd),
// fabric/rdma (a verbs-shaped provider interface, striped over rails; the
// software provider runs it over TCP) and fabric/tcp (dedicated,
// authenticated, checksummed multi-stream connections, optionally
// compressed). The owner side of every transport is a Source, which
// resolves a Claim (object, incarnation, capability token) to pinned
// memory. fabric/fabrictest is the conformance suite every transport
// passes. fabric/stack builds, starts and closes a runtime's whole set of
// transports from one Config, so callers above fabric (rdt) need not
// import any of them.
//
// The Planner compares the owner's and reader's Endpoints in the topology,
// ranks the transports that can reach (local, p2p, shm, rdma, tcp, best
// first), rules out the ones the other side does not serve (an Addressed
// transport whose address the Remote does not publish), retries a path that
// failed for a passing reason, and then falls back to the next. A transfer
// that takes a worse path than the topology allows, or falls back, is
// logged and counted: fallback is never silent.
//
// A transport that can move many objects of one owner together implements
// BatchReader (tcp pipelines the requests on a few connections, rdma
// resolves up to 256 objects per control round trip); Planner.ReadBatch
// coalesces a batch's items per (transport, owner) onto it, reads the rest
// one by one, and reads an item the batch path failed for a passing reason
// again on its own. Stats.Coalesced says how many moved together. Pushes
// have the same: BatchWriter (tcp pipelines eager writes, rdma resolves up
// to 256 sinks per round trip) and Planner.WriteBatch, grouped per
// (transport, destination) by the same code.
//
// A push of an object's strided runs (a resharded weight's rows) goes
// through Planner.WriteRuns: a GatherWriter (tcp, rdma, shm) sends the runs from
// the object with no packed copy; any other path gets them packed into staging
// memory first, logged and counted (tensorlane_gather_packed_total).
// CheckRuns is the one validator of a run list (ErrBadRuns).
package fabric
