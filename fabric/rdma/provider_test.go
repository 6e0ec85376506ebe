package rdma_test

import (
	"testing"

	"github.com/tensorlane/tensorlane/fabric/rdma"
	"github.com/tensorlane/tensorlane/fabric/rdma/softrdma"
)

// testProvider is the provider the rdma tests run against: loopback
// rails named names, with a way to corrupt what the owner sends next.
type testProvider interface {
	rdma.Provider
	InjectCorruption()
}

// newTestProvider makes the software provider; built with -tags ofi and
// run with TENSORLANE_RDMA_PROVIDER=ofi (and FI_PROVIDER=tcp), the same
// tests run against libfabric instead (provider_ofi_test.go).
var newTestProvider = func(t testing.TB, names ...string) testProvider {
	t.Helper()
	p, err := softrdma.New(softrdma.Config{NICs: loopbackNICs(names...)})
	if err != nil {
		t.Fatal(err)
	}
	return p
}
