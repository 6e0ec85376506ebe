// Package provbase is the skeleton the rdma providers share
// (fabric/rdma/softrdma over TCP, fabric/rdma/ofi over libfabric), so that
// a third provider (ibverbs) writes only what is its own: how bytes move
// and how memory is registered.
//
// What it holds: an embeddable Base (the NIC's name and open
// configuration, the device lock and closed state, the listener with its
// accept loop, queue-pair ids, the authenticated bootstrap on both ends
// and the bookkeeping of one accepted queue pair: idle deadline, bounded
// concurrent handlers, QPClosed once they returned); Fault, a queue pair's
// break-once state; Completions, a completion queue's ready list; and the
// encoding of a handler's error answer (a peerauth status code and text).
// The wire formats stay each provider's own: provbase frames nothing.
package provbase
