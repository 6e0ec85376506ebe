//go:build race

package rdma_test

// raceEnabled: the race detector slows the software provider's copies
// several times over, so throughput figures under it mean nothing.
const raceEnabled = true
