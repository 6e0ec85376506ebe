package topology_test

import (
	"context"
	"fmt"

	"github.com/tensorlane/tensorlane/topology"
)

func Example() {
	// Two racks of GB200 NVL72: each rack of 18 trays is one NVLink domain.
	c, err := topology.PresetCluster("gb200-nvl72", 36, 0)
	if err != nil {
		panic(err)
	}
	gpu := func(host string, i int) topology.Endpoint { return topology.Endpoint{Host: host, Device: i} }
	fmt.Println(c.PathBetween(gpu("h0", 0), gpu("h0", 3)))  // same tray
	fmt.Println(c.PathBetween(gpu("h0", 0), gpu("h17", 1))) // same rack
	fmt.Println(c.PathBetween(gpu("h0", 0), gpu("h18", 1))) // next rack
	h0, _ := c.Host("h0")
	fmt.Println(h0.NearestNICs(2)[0].RDMADevice)
	for _, d := range c.DomainsOf(topology.DomainNVLink) {
		fmt.Println(d.Kind, d.Name, len(d.Hosts), "hosts", len(d.Devices), "GPUs")
	}
	// Output:
	// NV18
	// MNNVL
	// NET
	// mlx5_2
	// nvlink nvl72-0 18 hosts 72 GPUs
	// nvlink nvl72-1 18 hosts 72 GPUs
}

func ExampleDiscover() {
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: "testdata/sysfs/mi300x"})
	if err != nil {
		panic(err)
	}
	h := d.Host
	fmt.Println(h.ID, len(h.Devices), h.Devices[0].Model, len(h.Links), "xGMI links")
	c := d.Cluster()
	fmt.Println(c.PathBetween(topology.Endpoint{Host: h.ID, Device: 0}, topology.Endpoint{Host: h.ID, Device: 5}))
	fmt.Println(h.NICPath(0, h.NearestNICs(0)[0].Name))
	// Output:
	// mi300x-node-3 8 MI300X-192GB 28 xGMI links
	// XGMI
	// PIX
}
