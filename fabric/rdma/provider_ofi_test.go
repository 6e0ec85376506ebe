//go:build ofi

package rdma_test

import (
	"os"
	"testing"

	"github.com/tensorlane/tensorlane/fabric/rdma/internal/faults"
	"github.com/tensorlane/tensorlane/fabric/rdma/ofi"
)

func init() {
	if os.Getenv("TENSORLANE_RDMA_PROVIDER") != "ofi" {
		return
	}
	// Every rail is a libfabric domain on loopback ("lo" of the net
	// provider unless TENSORLANE_OFI_PROVIDER says otherwise: tcp;ofi_rxm
	// crashes in libfabric 1.17 when an owner closes mid-transfer, see
	// docs/rdma-ofi.md), each with its own bootstrap listener and
	// endpoints.
	newTestProvider = func(t testing.TB, names ...string) testProvider {
		t.Helper()
		cfg := ofi.FromEnv()
		if cfg.Provider == "" {
			cfg.Provider = "net"
		}
		for _, n := range names {
			cfg.NICs = append(cfg.NICs, ofi.NIC{Name: n, Domain: "lo", Addr: "127.0.0.1:0"})
		}
		cfg.Faults = new(faults.Sim)
		p, err := ofi.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return testProvider{p, cfg.Faults}
	}
}
