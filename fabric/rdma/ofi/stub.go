//go:build !ofi

package ofi

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric/rdma"
)

// Provider is the libfabric provider; in this build (without the ofi
// tag) it cannot be created.
type Provider struct{}

var _ rdma.Provider = (*Provider)(nil)

// New fails with ErrNotBuiltIn: the binary was built without -tags ofi.
func New(cfg Config) (*Provider, error) { return nil, ErrNotBuiltIn }

// Probe reports that the provider is not built in.
func Probe(cfg Config) Availability {
	return Availability{Reason: ErrNotBuiltIn.Error()}
}

func (*Provider) Name() string           { return "ofi" }
func (*Provider) Devices() []rdma.Device { return nil }
func (*Provider) Open(context.Context, string, rdma.OpenConfig) (rdma.Context, error) {
	return nil, fmt.Errorf("%w", ErrNotBuiltIn)
}

// Fabric is empty: no libfabric provider in this build.
func (*Provider) Fabric() string { return "" }

// NICs is empty in this build.
func (*Provider) NICs() []NIC { return nil }

// HMEM says no device-memory registration: no libfabric in this build.
func (*Provider) HMEM() rdma.HMEMCaps {
	return rdma.HMEMCaps{Provider: "ofi", Note: ErrNotBuiltIn.Error()}
}
