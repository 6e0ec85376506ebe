package fabricsim_test

import (
	"fmt"

	"github.com/tensorlane/tensorlane/fabricsim"
	"github.com/tensorlane/tensorlane/topology"
)

// A weight sync of a 1 TB model from 256 H100s to 128, in inference
// replicas of 16 GPUs, on DGX H100 hosts with eight 400 Gb/s rails.
func Example() {
	c, err := topology.PresetCluster("dgx-h100", 48, 0)
	if err != nil {
		panic(err)
	}
	f, err := fabricsim.New(c, fabricsim.Spec{})
	if err != nil {
		panic(err)
	}
	gpus := f.GPUs(f.Hosts())
	res, err := f.WeightSync(fabricsim.WeightSync{Bytes: 1e12, Trainers: gpus[:256], Inference: gpus[256:], ReplicaGPUs: 16})
	if err != nil {
		panic(err)
	}
	fmt.Printf("%.2f s, line-rate bound %.2f s (%s), ratio %.2f\n", res.Seconds, res.BoundSeconds, res.BoundCut, res.RatioToBound)
	// Output: 1.29 s, line-rate bound 1.25 s (h32 ingress), ratio 1.03
}
