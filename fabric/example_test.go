package fabric_test

import (
	"fmt"

	"github.com/tensorlane/tensorlane/fabric"
	"github.com/tensorlane/tensorlane/fabric/local"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/topology"
)

// The planner ranks the transports a runtime runs for one source and
// destination, from the topology: here the in-process transports on a
// simulated two-host DGX H100 cluster. Between two GPUs of one host the
// NVLink path wins; to another host nothing running here reaches, and the
// plan says which path the topology would allow.
func ExamplePlanner() {
	cl, _ := topology.Preset("dgx-h100", 2)
	lc := local.Config{Process: "runtime-a", Topology: cl}
	p, _ := fabric.NewPlanner(fabric.PlannerConfig{Topology: cl}, local.New(lc), local.NewP2P(lc))

	src := fabric.Endpoint{Process: "runtime-a", Host: "h0", Device: tensor.GPUDevice(0)}
	plan := p.Plan(src, fabric.Endpoint{Process: "runtime-a", Host: "h0", Device: tensor.GPUDevice(5)})
	fmt.Println(plan)
	far := p.Plan(src, fabric.Endpoint{Process: "runtime-b", Host: "h1", Device: tensor.GPUDevice(5)})
	fmt.Println(far.Best, far.Chosen == "", far.Path)
	// Output:
	// h0/gpu:0 -> h0/gpu:5: path NV18, best p2p, chosen p2p (in-process)
	//   * p2p (in-process) device link NV18 (nvlink, 450 GB/s)
	//     local            same runtime: direct copy between devices
	// rdma true NET
}
