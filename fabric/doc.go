// Package fabric is how bytes move between tensorlane runtimes.
//
// A Transport reads an object's bytes from its owner into a reader's buffer;
// each implementation lives in a sub-package: fabric/local (same process:
// zero-copy views and device-to-device copies) and fabric/tcp (dedicated,
// authenticated, checksummed multi-stream connections). The owner side of
// every transport is a Source, which resolves a Claim (object, incarnation,
// capability token) to pinned memory.
//
// The Planner compares the owner's and reader's Endpoints in the topology,
// ranks the transports that can reach (local, p2p, shm, rdma, tcp, best
// first), and falls back to the next when a path fails. A transfer that
// takes a worse path than the topology allows, or falls back, is logged and
// counted: fallback is never silent.
package fabric
