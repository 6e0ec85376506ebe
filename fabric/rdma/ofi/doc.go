// Package ofi is an rdma.Provider over libfabric (OFI), the portable API
// under InfiniBand/RoCE (verbs), AWS EFA (efa), HPE Slingshot (cxi) and a
// userspace tcp provider that needs no RDMA hardware.
//
// It is built only with the build tag "ofi" (go build -tags ofi), which
// needs libfabric's headers and library (Debian: libfabric-dev). Without
// the tag New returns ErrNotBuiltIn and Probe says why, so the default
// build keeps working on machines without libfabric.
//
// How the verbs-shaped interface maps onto libfabric:
//
//   - a Device is a libfabric domain (fi_getinfo: "mlx5_0" for verbs,
//     "rdmap0s31-rdm" for efa, "lo" or "eth0" for tcp); its name is matched
//     against the topology's NIC Name or RDMADevice, with efa's "-rdm" and
//     "-dgrm" suffixes dropped, so nearest-NIC choice, striping over rails
//     and rail failover work as with the software provider;
//   - a listening device opens one reliable-datagram (FI_EP_RDM) target
//     endpoint whose memory registrations (fi_mr_reg) remote peers read and
//     write, and a TCP bootstrap listener at its Addr;
//   - a queue pair is its own endpoint (so closing it stops its transfers)
//     plus one TCP bootstrap connection to the remote device: both ends
//     authenticate there (libp2p identity, and the cluster key when one is
//     set, as every tensorlane data connection does), the remote sends its
//     endpoint address (fi_getname), and the connection then carries the
//     two-sided control messages (QueuePair.Call). One-sided READ and WRITE
//     go through libfabric (fi_read, fi_writemsg; a WRITE's scatter-gather
//     list, WorkRequest.SGL, is its iov, up to the domain's tx iov_limit)
//     and complete on a completion queue;
//   - completion queues sleep on the provider's wait fd where it has one:
//     a reader's queue with one request outstanding and no writes through
//     the Go netpoller (waitfd.go: a completion wakes a goroutine on a
//     running thread, not a thread blocked in poll(2)), the owner's target
//     loop and pipelines in poll(2) (the wait set does not pass on a
//     socket becoming writable), Config.PollWaitFD poll(2) everywhere;
//     else in fi_cq_sread on its wait object; where a provider has
//     neither, reads back off from a spin to 1 ms sleeps.
//
// Selecting it: TENSORLANE_RDMA_PROVIDER=ofi (or rdt.Config.Transports.RDMAProviderKind, a stack.Config field),
// TENSORLANE_OFI_PROVIDER=tcp|verbs|efa|... names the libfabric provider
// (default: the first fi_getinfo offers, which is its preference order).
// See docs/rdma-ofi.md for running it on a real cluster.
package ofi
