// Package testhelp holds the small helpers that tests across the module
// share: a fresh libp2p identity (Key), golden-file comparison (Golden),
// the median of a sample (Median), the process's CPU time (CPUTime),
// patterned tensors compared byte for byte (Fill, SameBytes), and a test
// process's own device-claims directory (Isolated, for TestMain).
//
// It is imported only from _test.go files. It depends on tensor and the
// libp2p core packages, never on fabric, rdt or sched, so any package's
// tests may use it (tensor's own internal tests excepted: that would be a
// cycle). Helpers that need rdt live in rdt/rdttest; the transport
// conformance suite lives in fabric/fabrictest. (Not named testutil: many
// tests already import prometheus/testutil under that name.)
package testhelp
