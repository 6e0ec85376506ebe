package envinfo

import (
	"fmt"
	"os"
	"strings"

	"github.com/tensorlane/tensorlane/fabric/rdma/ofi"
)

// rdmaProviders says which rdma providers this binary can run here, and
// why not: the software one always; libfabric's when built with -tags ofi
// and fi_getinfo offers an RMA provider.
func rdmaProviders() map[string]string {
	out := map[string]string{"soft": "available (software NICs over TCP)"}
	a := ofi.Probe(ofi.FromEnv())
	switch {
	case !a.BuiltIn:
		out["ofi"] = "unavailable: " + a.Reason
	case a.Reason != "":
		out["ofi"] = fmt.Sprintf("unavailable (libfabric %s): %s", a.Version, a.Reason)
	default:
		out["ofi"] = fmt.Sprintf("available (libfabric %s; RMA providers: %s)", a.Version, strings.Join(a.Providers, ", "))
	}
	sel := os.Getenv("TENSORLANE_RDMA_PROVIDER")
	if sel == "" {
		sel = "soft"
	}
	out["selected"] = sel + " (TENSORLANE_RDMA_PROVIDER)"
	return out
}
