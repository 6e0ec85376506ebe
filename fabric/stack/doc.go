// Package stack assembles the data transports of one runtime from one
// Config: it starts the "tcp" server and transport, the in-process "local"
// and "p2p" transports, the cross-process "p2p" and "shm" paths over shared
// memory (fabric/shm), the "rdma" path with its provider (the software
// provider over TCP on simulated hosts, libfabric with -tags ofi), and,
// when asked, link telemetry (fabric/linkstat) wired into rdma rail
// health. It publishes the addresses refs carry, lists the transports for
// the planner, and closes everything in the right order.
//
// A newcomer reads it as the place where transports are chosen and tuned:
// rdt (the user API) imports fabric and this package, never a transport
// itself (internal/archtest enforces it), as go-libp2p keeps its wiring in
// config/ and defaults.go apart from the transports.
//
// Every optional path that cannot start is logged at Warn and left out;
// the planner then reports it as not running, so the fallback shows in
// Explain and in the metrics. Devices on simulated hosts are simulated
// (memfd arenas) and the software rdma provider simulates NICs over TCP.
package stack
