// Package rdt is tensorlane's user API: direct tensor transport between
// actors.
//
// A Runtime is one process, or one simulated host within a process. It owns
// device memory (simulated accelerators by default), an object table, a
// libp2p control host (ed25519 identity, Noise, yamux) and data servers.
// Actors spawned on it Put tensors that stay in device memory and get back a
// Ref: a few hundred bytes that name the object, its owner and its layout,
// and carry a capability token. Refs travel in control Messages (Send,
// Receive) or in any channel of the caller's (MarshalBinary).
//
// A reader calls Get(ctx, ref, dstDevice). The fabric planner compares owner
// and reader in the topology and takes the best path: local (a zero-copy
// view on the owner's own device, a copy within the process otherwise), p2p
// (device to device over a device link or PCIe peer-to-peer, across
// processes by passing the owner's memfd), shm (another process of the same
// host, through shared memory), rdma (other hosts, one-sided reads through
// the NIC nearest each device, striped over rails), or tcp (anything
// reachable: authenticated, checksummed, multi-stream). Explain tells which
// path a Get takes and why; a worse path than the topology allows is logged
// and counted.
//
// Several processes may share a host, each claiming some of its devices
// (Config.VisibleDevices, TENSORLANE_DEVICES, else CUDA_VISIBLE_DEVICES); a device claimed by another
// live process is refused with ErrDeviceClaimed. Actor addresses and refs
// have text and binary forms (ParseActorAddr, ParseRef) for bootstrapping
// over any channel. Every blocking call honours its context
// and, without a deadline, Config.TransferTimeout.
//
// Lifecycle. References are counted with leases: a reader runtime that
// Holds a ref registers a lease with the owner over the control channel and
// renews it every Config.LeaseRenew; Release drops it. A Get leases the
// object only while it runs, so a reader done with a Get releases the
// tensor it got and nothing else. The owner
// actor's Release frees the object once no lease is left (a dead reader's
// lease expires after Config.LeaseExpiry); Free frees it at once and revokes
// every ref. WaitFreed waits until the memory is back. Shutdown(ctx) refuses
// new work, lets transfers in flight finish within ctx, aborts the rest and
// releases everything; no goroutine outlives it. A restarted owner (same
// identity, new incarnation) refuses refs from its previous life with
// ErrStaleRef.
//
// Failures. Peers a Get depends on, and peers watched with WatchPeer, are
// sent a heartbeat every Config.HeartbeatInterval (1 s); a lost connection
// that cannot be re-dialled, or HeartbeatMisses (3) missed heartbeats,
// declares the owner incarnation dead, and every Get waiting on it returns
// ErrOwnerDied with its destination memory released. A transfer with no
// progress for Config.StallTimeout fails with ErrTransferStalled.
//
// Weight sync at scale. Push writes an owner's object into a Slot a reader
// reserved. Broadcast writes one object into many readers' slots along a
// pipelined, topology-aware tree (ExplainBroadcast draws it): the owner
// feeds one reader per host along a chain of hosts, each host's first
// reader feeds the others there, chunks are forwarded as they land, so the
// owner's egress carries each byte about once; a reader that dies is routed
// around (its orphans re-parented to a live ancestor) and the result says,
// per reader, who has the data and who fed it. Slots reserved
// WithGenerations take no write while their reader has not said Done with
// the generation it holds; WaitConsumed waits for a step's readers.
// GetBatch moves a state dict with one lease round trip per owner, and
// PushBatch with one push notice per slot runtime, both coalesced per path
// where the path can (tcp, rdma, shm); BroadcastBatch sends one along one tree, one setup round per
// reader. Push with PushRuns sends runs of an object (a resharded shard's
// strided rows, rdt/reshard) straight from it where the path can (tcp). GetAsync, GetBatchAsync, StartBroadcast and StartBroadcastBatch
// return a Handle to Await or Cancel, with Progress in bytes.
//
// Security. Config.ClusterKey makes the control channel a libp2p private
// network and adds proof of the key to the data handshake, so non-members
// can open neither; Config.AllowPeers admits only the listed peers on both;
// refs carry an unguessable capability token; Config.EncryptData encrypts
// data connections (AES-256-GCM, keys from an X25519 exchange bound to both
// identities).
//
// Errors are typed: ErrMalformedRef, ErrObjectNotFound, ErrObjectFreed,
// ErrStaleRef, ErrUnauthorized (a forged token, a peer not admitted),
// ErrOwnerDied, ErrPeerUnreachable, ErrTransferStalled, ErrOutOfMemory,
// ErrTooSmall, ErrClosed, ErrDeviceClaimed, ErrDeliveryUnknown,
// ErrMalformedAddr, and for broadcasts ErrSlotBusy, ErrReaderDied,
// ErrBroadcastAborted; test them with errors.Is.
package rdt
