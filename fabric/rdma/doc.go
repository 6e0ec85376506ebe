// Package rdma is tensorlane's "rdma" path: one-sided reads (and pushes)
// of an owner's registered memory through the NICs nearest each device,
// striped over every rail that connects the two hosts.
//
// It has three parts:
//
//   - a verbs-shaped provider interface (Provider, Context,
//     ProtectionDomain, MemoryRegion, QueuePair, CompletionQueue), small
//     enough to implement over libibverbs later without touching callers;
//     fabric/rdma/softrdma implements it in software over TCP;
//   - Server, the owner side: a reader's control message (sent over a
//     rail's queue pair) resolves a fabric.Claim through the owner's
//     fabric.Source, which pins the object, and registers the pinned range
//     on every NIC; the keys go back to the reader. The pin lasts until the
//     reader says done or its queue pair drops; Revoke (on Free)
//     deregisters at once, so later accesses fail with a remote access
//     error, which the reader reports as fabric.ErrObjectFreed;
//   - Transport, the reader side (fabric.Transport, fabric.Writer and
//     fabric.GatherWriter):
//     it orders the owner's NICs by closeness to the source device and its
//     own by closeness to the destination device (topology.NearestNICs:
//     same PCIe switch, then NUMA node), cuts large transfers into slices
//     (512 KiB to 8 MiB by default, growing with the transfer) and
//     spreads them over all rails in proportion to
//     each rail's measured throughput (an EWMA), with a bounded number of
//     slices in flight per rail. A slice that fails is moved to another
//     rail; a rail that fails repeatedly is paused with a doubling backoff
//     (1 s up to 30 s by default), logged with slog and counted in
//     Metrics, and the transfer completes on the remaining rails.
//     Degrade marks a rail that still works but whose link is bad (link
//     telemetry: queueing, retransmissions; rdt wires fabric/linkstat to
//     it): it gets no new slice while another rail can take one, until
//     Recover or the mark's end; Rails shows it and
//     tensorlane_rail_health_pauses_total counts it.
//
// An owner's rails travel in Remote.Addrs["rdma"] as
// "nic0=10.1.0.2:4791,nic1=10.2.0.2:4791" (FormatAddrs, ParseAddrs).
//
// The owner ties a registration to the queue pair its resolve came over.
// If the owner sees that queue pair break, it releases the registration
// and the reader registers again (up to three times) before giving up
// with fabric.ErrPeerClosed, which the planner may retry or fall back
// from; if only the reader sees it (a cut link), the data goes on over
// the other rails and the final "done" travels over one of them.
//
// A gathered push (WriteRuns, fabric.GatherWriter: a resharded move's
// strided rows) sends the runs from the source object with no packed copy:
// the object is registered once per NIC as a push's source is, the
// destination range is cut into the usual slices, and each slice goes out
// as WRITEs whose scatter-gather lists (WorkRequest.SGL, verbs' sg_list)
// are the pieces of runs that fill it, at most the device's MaxSGE pieces
// each (SGELimit; softrdma 256, so a slice of 4 KiB runs takes one or two
// WRITEs; ofi the domain's tx iov_limit, 4 for libfabric's tcp and net
// providers). The owner sees ordinary WRITEs, and retries, rail failover
// and the rate estimates work per WRITE as for a plain push. Where a
// rail's device takes too few pieces for WRITEs of 256 KiB on average
// (ofi's 4 with 4 KiB runs: 16 KiB WRITEs took 29x a plain push), the
// runs are packed into a buffer first, counted in
// tensorlane_rdma_gather_packed_total.
//
// A batch (ReadBatch, fabric.BatchReader) resolves up to 256 objects of
// one owner in one control round trip (each a registration of its own,
// refused or granted on its own), moves them 16 at a time with at most
// 64 MiB outstanding, and releases them many per message (batch.go,
// batchwire.go).
package rdma
