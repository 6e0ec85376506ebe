package rdma_test

import (
	"testing"

	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/internal/faults"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
)

// testProvider is the provider the rdma tests run against: loopback
// rails named names, with a way to corrupt what the owner sends next (the
// Sim its Config carries).
type testProvider struct {
	rdma.Provider
	faults *faults.Sim
}

// InjectCorruption damages the next frame the provider sends as an owner.
func (p testProvider) InjectCorruption() { p.faults.CorruptNext() }

// newTestProvider makes the software provider; built with -tags ofi and
// run with TENSORLANE_RDMA_PROVIDER=ofi (and FI_PROVIDER=tcp), the same
// tests run against libfabric instead (provider_ofi_test.go).
var newTestProvider = func(t testing.TB, names ...string) testProvider {
	t.Helper()
	sim := new(faults.Sim)
	p, err := softrdma.New(softrdma.Config{NICs: loopbackNICs(names...), Faults: sim})
	if err != nil {
		t.Fatal(err)
	}
	return testProvider{p, sim}
}
