// Package harness runs tensorlane's benchmark matrix: every path (local,
// p2p in one process and across processes, shm, rdma, tcp, tcp with
// compression) in pull and push mode over a range of sizes and in-flight
// counts, each interleaved round by round with its baseline from package
// bench (single-thread memcpy for on-host paths, a raw loopback TCP socket
// and a libp2p stream for rdma and tcp) so that drift on a shared machine
// cancels out; a latency mode comparing small Gets with a raw TCP
// ping-pong; memory figures; and Check, the regression guard that compares
// ratios (never absolute times) with a stored baseline.
//
// Every cell checks that its transfers took the transport it names and
// fails the run with ErrWrongPath otherwise.
//
// It is a separate package from bench because it drives rdt, and rdt's own
// Go benchmarks import bench for the baselines.
package harness
