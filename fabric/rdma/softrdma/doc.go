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
// never data. Every frame is checksummed with CRC-32C and a corrupt frame
// breaks the queue pair before its payload touches registered memory.
//
// What is emulated is the NIC: the copies are made by the host CPU (one
// into a staging chunk on each side, so that a deregistration waits for at
// most one chunk and nothing is touched after it returns), where real
// hardware would DMA.
package softrdma
