// Package softrdma is a software RDMA provider for fabric/rdma: the verbs
// model (devices, protection domains, registered memory named by keys,
// reliable connected queue pairs, one-sided READ and WRITE, completion
// queues) carried over TCP, so that the rdma transport and its multi-rail
// striping run, and are tested, on machines without RDMA NICs.
//
// Each NIC is its own TCP listener bound to its own address; a host (or
// network namespace) with two interfaces configured as two NICs has two
// real rails. A queue pair is one TCP connection between two NICs,
// authenticated in both directions with the libp2p identities of the two
// runtimes (fabric/internal/peerauth). The passive side serves READ and
// WRITE requests straight from and into registered memory after checking
// the key, the access rights and the range against its registration
// table: a wrong or revoked key gets a remote access error completion,
// never data. Every frame header is checksummed (CRC-32) and checked
// before anything acts on it; payloads move straight between the socket
// and registered memory, as a NIC's DMA would, and are checked against
// their own CRC-32 once in: a corrupt payload fails its work request and
// breaks the queue pair.
//
// Keys resist guessing: rkeys are random, I/O addresses are random, a
// region registered with RegisterMemoryFor answers only queue pairs of the
// peer it was registered for, and a queue pair that presents 8 keys never
// issued to its peer is dropped (counted in fabric.ListenerMetrics). Each
// NIC's listener runs fabric/internal/acceptor: accept errors such as
// EMFILE are retried with backoff, queue pairs are capped in total and per
// peer, and an idle one is closed (rdma.OpenConfig.Limits).
//
// What is emulated is the NIC, on the host CPU. No staging copies: a
// deregistration waits for the socket transfers in progress on its region
// (each at most one chunk, Config.ChunkSize) and aborts those that take
// longer than a short grace (their queue pair breaks), so nothing touches
// the region after it returns.
package softrdma
