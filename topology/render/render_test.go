package render_test

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/render"
)

// The command's golden files (cmd/tensorlane/testdata/topo) pin the output
// byte for byte; these tests pin what the renderers promise whatever the
// layout.

func TestDotQuote(t *testing.T) {
	assert.Equal(t, `"a\nb"`, render.DotQuote("a\nb"))
	assert.Equal(t, `"say \"hi\" \\ ok"`, render.DotQuote(`say "hi" \ ok`))
}

func TestJSON(t *testing.T) {
	c, err := topology.NewCluster(topology.ClusterSpec{Preset: "gb200-nvl72", Hosts: 20})
	require.NoError(t, err)
	v := render.JSON(c, &render.Source{Kind: "preset", Warnings: []topology.Warning{{Path: "/sys/x", Msg: "odd"}}})
	assert.Equal(t, "preset", v.Source)
	require.Len(t, v.Hosts, 20)
	d := v.Hosts[19].Devices[2]
	assert.Equal(t, "h19/2", d.ID)
	assert.Equal(t, "mlx5_2", d.NearestNIC, "each device names the NIC nearest to it")
	assert.NotEmpty(t, d.NICPath)
	assert.Len(t, v.Domains, 4, "two NVLink domains, two racks (the command's test checks the JSON shape)")
	require.Len(t, v.Warnings, 1)
	assert.Contains(t, v.Warnings[0], "odd")
}

// Every device and NIC of the host heads a row of the matrix, and every
// node of the graph is declared once.
func TestMatrixAndDot(t *testing.T) {
	c, err := topology.Preset("dgx-h100", 2)
	require.NoError(t, err)
	var m strings.Builder
	render.Matrix(&m, c, c.Hosts[0])
	for i := range c.Hosts[0].Devices {
		assert.Contains(t, m.String(), fmt.Sprintf("\nGPU%d ", i))
	}
	var d strings.Builder
	require.NoError(t, render.Dot(&d, c))
	assert.True(t, strings.HasPrefix(d.String(), "graph "))
	assert.Contains(t, d.String(), `"h1/`)
}

func ExampleTree() {
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: "../testdata/sysfs/vm"})
	if err != nil {
		panic(err)
	}
	render.Tree(os.Stdout, d.Cluster(), &render.Source{Kind: "discovered", Warnings: d.Warnings})
	// Output:
	// host vm (discovered): 2 CPUs, 1 NUMA node(s), 0 device(s), 1 NIC(s)
	//   no accelerator found: showing CPUs, NUMA nodes and NICs
	// └─ NUMA 0: CPUs 0-1
	//    └─ root complex pci0000:00
	//       └─ NIC eth0 up 0000:00:03.0 [virtio-pci]
}
