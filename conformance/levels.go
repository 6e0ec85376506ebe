// Package conformance is the one definition of what each maturity level
// demands of every plug-in point of tensorlane: device plugins (topology),
// device back-ends (tensor memory), transports (fabric), rdma providers
// (fabric/rdma) and the Ray plug-in (python/tensorlane/ray.py). The levels
// are topology.Maturity's four; a kind's checks are the evidence of its
// levels, and the level a plug-in point reaches is the highest whose
// checks, and those of every level below, all pass.
//
// `tensorlane conformance` prints every point's declared level and, with
// --run in a checkout, runs the checks and prints the level verified;
// docs/ci.md lists the levels.
package conformance

import (
	"github.com/tensorlane/tensorlane/topology"
)

// Level is a maturity level: experimental, alpha, beta, stable.
type Level = topology.Maturity

// The levels, shared with topology's device plugins.
const (
	Experimental = topology.Experimental
	Alpha        = topology.Alpha
	Beta         = topology.Beta
	Stable       = topology.Stable
)

// Kind is a plug-in point.
type Kind string

// The plug-in points.
const (
	DevicePlugin  Kind = "device-plugin"  // topology.Plugin: finds devices
	DeviceBackend Kind = "device-backend" // tensor.Memory: holds and copies their bytes
	Transport     Kind = "transport"      // fabric.Transport: moves bytes between runtimes
	RDMAProvider  Kind = "rdma-provider"  // fabric/rdma's provider: verbs-shaped one-sided I/O
	RayPlugin     Kind = "ray-plugin"     // tensorlane.ray: Ray's tensor transport
)

// Kinds lists the plug-in points in the order they are printed.
var Kinds = []Kind{DevicePlugin, DeviceBackend, Transport, RDMAProvider, RayPlugin}

// Demands is what each level asks of any plug-in point, in words common to
// every kind: the one definition. Check.Level ties a kind's tests to it.
var Demands = map[Level]string{
	Experimental: "implements its interface and builds; bad input gets a typed error, never a panic or a hang; " +
		"nothing it starts outlives Close (goleak); its fuzz targets' seeds pass",
	Alpha: "its kind's whole conformance suite passes on simulated or loopback hardware under -race: " +
		"every size and layout, concurrency, cancellation, and faults (a peer that dies, stalls or sends " +
		"garbage) surfacing as typed errors within bounded time",
	Beta: "alpha, and it holds up in the nightly tier: the multi-host fault matrix (network namespaces, " +
		"links cut, peers killed), the soak, and the A/B performance guard, with figures against a " +
		"baseline measured in the same run",
	Stable: "beta, and the suite has passed on the real hardware or deployment it targets (GPUs, RDMA NICs, " +
		"a multi-node cluster), recorded in the release's tier summary; no open correctness issue",
}

// Check is one piece of evidence for a level: a command run in a checkout
// of the repository (a go test, a pytest), passing when it exits 0.
type Check struct {
	Level Level
	Name  string
	Cmd   []string
	Env   []string // KEY=VALUE added to the command's environment
	// Needs names what the check needs beyond a checkout and Go (a GPU,
	// root, libfabric); a check whose Probe fails is not run, and the
	// level stays unverified rather than failed.
	Needs string
	Probe func() error
}

// Point is one plug-in point implementation.
type Point struct {
	Kind     Kind
	Name     string
	Declared Level
	Checks   []Check
}

func goTest(pkg, run string, tags ...string) []string {
	cmd := []string{"go", "test", "-race", "-count=1", "-timeout", "15m"}
	if len(tags) > 0 {
		cmd = append(cmd, "-tags", tags[0])
	}
	return append(cmd, "-run", run, pkg)
}
