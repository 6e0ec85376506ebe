package sched_test

import (
	"fmt"

	"github.com/tensorlane/tensorlane/sched"
	"github.com/tensorlane/tensorlane/topology"
)

// The labels a Ray node on host h1 of a GB200 NVL72 rack starts with, in
// the vocabulary of RaySpec's label selectors.
func ExampleRayNodeLabels() {
	c, _ := topology.Preset("gb200-nvl72", 2)
	h, _ := c.Host("h1")
	labels, _ := sched.RayNodeLabels(h)
	fmt.Printf("ray start --labels=%q\n", sched.RayStartLabels(labels))
	// Output:
	// ray start --labels="ray.io/accelerator-type=GB200,tensorlane.io/host=h1,topology.tensorlane.io/nvlink-domain=nvl72-0,topology.tensorlane.io/rack=rack0"
}
