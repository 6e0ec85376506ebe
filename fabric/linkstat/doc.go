// Package linkstat collects per-connection link telemetry (round-trip
// time, retransmissions, bytes) for the data connections a transport
// registers, exports it as Prometheus metrics, and reports a health signal:
// a link whose RTT inflates far past its minimum, or that retransmits more
// than a small share of its segments, is degraded.
//
// Two modes give the same figures:
//
//   - eBPF (ModeEBPF): a sock_ops program, written with cilium/ebpf's
//     assembler (no clang), attached to a cgroup v2 that holds this process
//     alone: its own, when no other process shares it (a container, a
//     systemd unit), else a child cgroup made for it, into which the
//     process moves. A cgroup shared with other processes (the root
//     cgroup of a host above all) is never used: the program would hook
//     their sockets too. On connection establishment it asks the kernel for RTT,
//     retransmission, state and segment-sent callbacks, and on each it files
//     the socket's counters in an LRU map keyed by the socket cookie, which
//     Track reads with SO_COOKIE. The figures are those of the socket's last
//     event: an ACK that yields no RTT sample (one that acknowledges data
//     the peer had already SACKed, common after loss recovery) is counted
//     only at the socket's next event, so a connection that went idle right
//     after such an ACK shows slightly fewer bytes acknowledged than
//     TCP_INFO would. RTT and retransmissions, the health figures, are
//     recorded as they happen.
//   - TCP_INFO (ModeTCPInfo): where BPF or cgroup v2 is not permitted (or
//     Config.ForceTCPInfo is set) the monitor polls getsockopt(TCP_INFO) on
//     each tracked connection at every refresh.
//
// New says in a log line which mode it runs in, which cgroup and why, and
// why eBPF was not used (a warning, as is moving the process into a child
// cgroup);
// tensorlane_linkstat_mode says it in the metrics. In eBPF mode a
// connection with no sample in the map (established before the program was
// attached, or outside its cgroup) is read with TCP_INFO, and a log line
// says so.
//
// # Health signal
//
// Each refresh (Config.Interval, or Refresh) re-evaluates every link;
// LinkStats.Degraded and Reason say why, Monitor.Degraded lists them, and
// Config.OnHealth (and every function given to Monitor.Subscribe) is called
// on every transition. A transport that stripes over several rails or
// streams can pause a degraded one and resume it when it recovers: rdt does
// so for the RDMA rails (rdt.Config.Transports.LinkMonitor, wired by fabric/stack; rdma.Transport.Degrade);
// fabric/tcp's streams are measured but not paused.
//
// To measure fabric/tcp's data connections, give the transport the
// monitor's dialer: tcp.Config{Dial: mon.Dial} (or mon.DialFunc to keep a
// dialer of your own and choose the labels).
//
// Metrics: tensorlane_link_rtt_seconds, tensorlane_link_min_rtt_seconds,
// tensorlane_link_retransmits_total, tensorlane_link_sent_bytes_total,
// tensorlane_link_received_bytes_total, tensorlane_link_cwnd_segments,
// tensorlane_link_degraded (labels link, transport, peer, id, source),
// tensorlane_linkstat_mode{mode} and tensorlane_link_health_changes_total.
package linkstat
