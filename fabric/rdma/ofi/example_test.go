//go:build !ofi

package ofi_test

import (
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/fabric/rdma/ofi"
)

// Without the ofi build tag the provider is a stub that says so; Probe
// gives the reason `tensorlane env` prints.
func Example() {
	_, err := ofi.New(ofi.Config{})
	fmt.Println(errors.Is(err, ofi.ErrNotBuiltIn))
	fmt.Println(ofi.Probe(ofi.Config{}).BuiltIn)
	// Output:
	// true
	// false
}
