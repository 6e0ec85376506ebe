// Package worker is the engine of `tensorlane worker`: one runtime that
// claims a host of a topology preset and is driven over a line-based JSON
// protocol on stdin/stdout (put, get, free, info, connect, the broadcast
// operations, exit), so that a test harness can run several runtimes as
// separate processes, one per network namespace, and inject faults (kill -9,
// link down, netem) from outside. internal/multihost drives it that way.
//
// Run serves the protocol; the message types live in internal/workerproto,
// shared with the driver. FillPattern and CheckPattern are the content every
// put writes and every get verifies, and ErrorCode names the typed condition
// behind an error, so that a driver in another process (and the soak's
// tallies) can tell failures apart. Devices are simulated arenas.
package worker
