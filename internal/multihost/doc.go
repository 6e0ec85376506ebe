// Package multihost runs tensorlane as several real processes on several
// (virtual) machines and breaks things between them.
//
// A Cluster is a set of hosts, each a Linux network namespace plugged into
// one bridge by a veth pair (the bridge namespace is the switch), each
// running `tensorlane worker` claiming one host of a topology preset (by
// default dgx-h100, three hosts, small simulated device arenas). The test
// drives the workers over their JSON-lines protocol on stdin/stdout (put,
// get with byte-for-byte verification, free, info) and injects faults from
// outside: SIGKILL of a worker's process group, a cable pulled at the
// bridge (Host.SetLink), packet loss and latency with tc or BPF
// (netns.Shape, netns.DropRandom), a restart under the same identity, a
// rogue process without the cluster key.
//
// The fault-matrix tests in this package check that each case ends with the
// expected typed error or a completed, verified transfer, within a bound,
// and with the owners' device memory back to its baseline; they log the
// time each failure took to surface (a table printed at the end of
// `go test -v`). Network faults run over the path the planner picks between
// two DGX hosts (rdma, software provider); TENSORLANE_FAULT_MATRIX=full
// (make nightly) runs them over tcp as well. They skip, saying why, where network
// namespaces cannot be created (not root, no ip or tc). Namespaces and
// processes are removed in t.Cleanup, also when a test fails; a worker dies
// with the test process (PR_SET_PDEATHSIG) even if that crashes.
package multihost
