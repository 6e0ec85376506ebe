package topology_test

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/tensorlane/tensorlane/internal/testhelp"
	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/topotest"
)

var updateTrees = flag.Bool("update-trees", false, "regenerate testdata/sysfs from topotest fixtures")

func envOf(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func treeDir(name string) string { return filepath.Join("testdata", "sysfs", name) }

// TestFixtureTrees regenerates the committed sysfs trees with
// -update-trees and otherwise checks that they match the generators.
func TestFixtureTrees(t *testing.T) {
	for _, fx := range topotest.Fixtures() {
		t.Run(fx.Name, func(t *testing.T) {
			if *updateTrees {
				require.NoError(t, os.RemoveAll(treeDir(fx.Name)))
				require.NoError(t, fx.Build(treeDir(fx.Name)))
				return
			}
			tmp := t.TempDir()
			require.NoError(t, fx.Build(tmp))
			assert.Equal(t, listTree(t, tmp), listTree(t, treeDir(fx.Name)), "run go test ./topology -update-trees")
		})
	}
}

func listTree(t *testing.T, root string) []string {
	var out []string
	err := filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		if fi.IsDir() {
			return nil // git keeps no empty directories; compare files and links only
		}
		rel, _ := filepath.Rel(root, p)
		entry := rel
		if fi.Mode()&os.ModeSymlink != 0 {
			target, _ := os.Readlink(p)
			entry += " -> " + target
		} else if fi.Mode().IsRegular() {
			b, _ := os.ReadFile(p)
			entry += " = " + string(b)
		}
		out = append(out, entry)
		return nil
	})
	require.NoError(t, err)
	return out
}

func discoverFixture(t testing.TB, fx topotest.Fixture) *topology.Discovery {
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: treeDir(fx.Name), Env: envOf(fx.Env)})
	require.NoError(t, err)
	return d
}

// TestDiscoverGolden discovers each committed tree and compares the model
// (as a topology file) and the warnings with golden files.
func TestDiscoverGolden(t *testing.T) {
	for _, fx := range topotest.Fixtures() {
		t.Run(fx.Name, func(t *testing.T) {
			d := discoverFixture(t, fx)
			h := d.Host
			assert.Len(t, h.Devices, fx.Want.Devices)
			assert.Len(t, h.NICs, fx.Want.NICs)
			assert.Len(t, h.NUMA, fx.Want.NUMA)
			assert.Len(t, h.Links, fx.Want.Links)
			rdma := 0
			for _, n := range h.NICs {
				if n.RDMA() {
					rdma++
				}
			}
			assert.Equal(t, fx.Want.RDMANICs, rdma)
			require.NoError(t, d.Cluster().Validate())
			for _, p := range d.Plugins {
				assert.Empty(t, p.Err, p.Name)
			}

			b, err := topology.Marshal(d.Cluster())
			require.NoError(t, err)
			testhelp.Golden(t, "testdata/golden/discover-"+fx.Name+".topo.json", b)
			var ws []string
			for _, w := range d.Warnings {
				ws = append(ws, w.String())
			}
			testhelp.Golden(t, "testdata/golden/discover-"+fx.Name+".warnings", []byte(strings.Join(ws, "\n")+"\n"))

			back, err := topology.Unmarshal(b)
			require.NoError(t, err)
			assert.Equal(t, d.Cluster(), back, "discovered model round-trips through the file")
		})
	}
}

func TestDiscoverPaths(t *testing.T) {
	fxs := map[string]topotest.Fixture{}
	for _, fx := range topotest.Fixtures() {
		fxs[fx.Name] = fx
	}
	type pair struct {
		a, b int
		want string
	}
	for _, tt := range []struct {
		fixture string
		pairs   []pair
		nearest map[int]string
	}{
		{"dgx-h100", []pair{{0, 1, "NV18"}, {0, 0, "SELF"}}, map[int]string{0: "mlx5_0", 5: "mlx5_5"}},
		{"mi300x", []pair{{0, 7, "XGMI"}}, map[int]string{3: "bnxt_re3"}},
		{"tpu-v5p", []pair{{0, 1, "ICI"}, {0, 2, "ICI"}, {0, 3, "SYS"}, {1, 2, "SYS"}}, nil},
		{"trn2", []pair{{0, 1, "NL"}, {0, 4, "NL"}, {0, 5, "NODE"}, {0, 10, "SYS"}}, nil},
		{"gaudi3", []pair{{0, 7, "ROCE3"}}, map[int]string{0: "mlx5_0", 7: "mlx5_3"}},
	} {
		t.Run(tt.fixture, func(t *testing.T) {
			d := discoverFixture(t, fxs[tt.fixture])
			c := d.Cluster()
			id := d.Host.ID
			for _, p := range tt.pairs {
				got := c.PathBetween(topology.Endpoint{Host: id, Device: p.a}, topology.Endpoint{Host: id, Device: p.b})
				assert.Equal(t, p.want, got.String(), "%d-%d", p.a, p.b)
			}
			for dev, nic := range tt.nearest {
				nics := d.Host.NearestNICs(dev)
				require.NotEmpty(t, nics)
				assert.Equal(t, nic, nics[0].RDMADevice, "device %d", dev)
			}
		})
	}
}

func TestDiscoverPCIeClasses(t *testing.T) {
	// Without device links, the DGX tree's PCIe placement shows.
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{
		Root: treeDir("dgx-h100"), Plugins: []topology.Plugin{topology.NVIDIAPlugin()}})
	require.NoError(t, err)
	h := d.Host
	h.Links = nil
	c := d.Cluster()
	for _, tt := range []struct {
		a, b int
		want topology.PathClass
	}{
		{0, 1, topology.PathPXB},  // two leaf switches under one switch
		{0, 2, topology.PathNODE}, // two root complexes of one socket
		{0, 4, topology.PathSYS},
	} {
		got := c.PathBetween(topology.Endpoint{Host: h.ID, Device: tt.a}, topology.Endpoint{Host: h.ID, Device: tt.b})
		assert.Equal(t, tt.want, got.Class, "%d-%d", tt.a, tt.b)
	}
	p := h.NICPath(0, "ibp22s0")
	assert.Equal(t, topology.PathPIX, p.Class)
	p = h.NICPath(0, "ibp26s0")
	assert.Equal(t, topology.PathPXB, p.Class)
	assert.Equal(t, topology.PathSYS, h.NICPath(0, "enp232s0np0").Class)
}

func TestDiscoverLabels(t *testing.T) {
	fx := topotest.Fixtures()[2] // tpu-v5p
	require.Equal(t, "tpu-v5p", fx.Name)
	tmp := t.TempDir()
	require.NoError(t, fx.Build(tmp))
	topotest.NewTree(tmp).File("etc/podinfo/labels", `topology.kubernetes.io/zone="us-east5-a"
topology.tensorlane.io/rack="r12"
not a label
# comment`)
	env := map[string]string{"TPU_NAME": "s1", "TPU_WORKER_ID": "3", "TPU_TOPOLOGY": "2x2x4",
		topology.EnvLabels: "team=ml, topology.tensorlane.io/rack=r13,broken"}
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: tmp, Env: envOf(env), HostID: "w3",
		Labels: map[string]string{"owner": "ci"}})
	require.NoError(t, err)
	l := d.Host.Labels
	assert.Equal(t, "w3", d.Host.ID)
	assert.Equal(t, "s1", l[topology.LabelSlice])
	assert.Equal(t, "3", l[topology.LabelSliceWorker])
	assert.Equal(t, "us-east5-a", l[topology.LabelZone])
	assert.Equal(t, "r13", l[topology.LabelRack], "environment overrides files")
	assert.Equal(t, "ml", l["team"])
	assert.Equal(t, "ci", l["owner"])
	assert.Equal(t, "TPU-v5p", l[topology.LabelAccelerator])
	var msgs []string
	for _, w := range d.Warnings {
		msgs = append(msgs, w.String())
	}
	assert.Contains(t, strings.Join(msgs, "\n"), "etc/podinfo/labels: line 3")
	assert.Contains(t, strings.Join(msgs, "\n"), `"broken" is not a key=value label`)
}

func TestDiscoverSysfsOnlyRoot(t *testing.T) {
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: filepath.Join(treeDir("dgx-h100"), "sys")})
	require.NoError(t, err)
	assert.Len(t, d.Host.Devices, 8)
	assert.Equal(t, "/dev/nvidia3", d.Host.Devices[3].DevNode, "dev/ is found beside the sysfs")
}

func TestDiscoverErrors(t *testing.T) {
	_, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: filepath.Join(t.TempDir(), "nope")})
	assert.ErrorIs(t, err, topology.ErrNoRoot)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	_, err = topology.Discover(ctx, topology.DiscoverConfig{Root: treeDir("vm")})
	assert.ErrorIs(t, err, context.Canceled)

	// An empty directory is a machine without anything: one NUMA node.
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: t.TempDir()})
	require.NoError(t, err)
	assert.Len(t, d.Host.NUMA, 1)
	assert.Empty(t, d.Host.Devices)
	assert.NotEmpty(t, d.Warnings)
}

// TestDiscoverBadInput damages a DGX tree in every way sysfs can be
// damaged and checks that discovery completes with warnings naming files.
func TestDiscoverBadInput(t *testing.T) {
	tmp := t.TempDir()
	require.NoError(t, topotest.BuildDGXH100(tmp))
	tr := topotest.NewTree(tmp)
	gpu0 := "sys/bus/pci/devices/0000:15:00.0"
	tr.File(gpu0+"/numa_node", "9999999")                                // absurd
	tr.File("sys/bus/pci/devices/0000:19:00.0/vendor", "nvidia")         // malformed
	tr.File("sys/bus/pci/devices/0000:35:00.0/class", "0x1234567890")    // out of range
	tr.File(gpu0+"/current_link_speed", "fast")                          // unparsable
	tr.Raw("sys/devices/system/node/node1/distance", []byte("21 ten\n")) // malformed
	tr.File("sys/devices/system/node/node0/cpulist", "5-1")              // bad range
	tr.Link("sys/bus/pci/devices/0000:99:00.0", "0000:99:00.0")          // loop to itself
	tr.Link("sys/bus/pci/devices/0000:9a:00.0", "../../../devices/a")    // dangling
	tr.Link("sys/devices/a", "b").Link("sys/devices/b", "a")             // loop pair
	tr.Link("sys/bus/pci/devices/0000:9b:00.0", "/sys/devices/a")        // into the loop
	tr.File("sys/bus/pci/devices/garbage", "x")                          // not an address
	tr.Raw("sys/class/infiniband/mlx5_3/ports/1/rate", make([]byte, 100<<10))
	tr.Link("sys/class/net/ibp28s0/device", "device") // loop
	tr.File("etc/tensorlane/labels", "=novalue\nk=v")
	tr.File("proc/driver/nvidia/gpus/0000:39:00.0/information", "Device Minor: -7")
	require.NoError(t, tr.Err())
	require.NoError(t, os.Chmod(filepath.Join(tmp, "sys/bus/pci/devices/0000:39:00.0/device"), 0)) // no effect for root

	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: tmp})
	require.NoError(t, err)
	require.NoError(t, d.Cluster().Validate())
	var all []string
	for _, w := range d.Warnings {
		all = append(all, w.String())
	}
	text := strings.Join(all, "\n")
	for _, want := range []string{
		gpu0 + "/numa_node: absurd value",
		"0000:19:00.0/vendor: unreadable or not a 16-bit hex id",
		"0000:35:00.0/class",
		gpu0 + "/current_link_speed: cannot parse",
		"node1/distance: bad distance",
		"node0/cpulist",
		"0000:99:00.0: cannot resolve",
		"0000:9b:00.0: cannot resolve",
		"sys/bus/pci/devices/garbage: not a PCI address",
		"etc/tensorlane/labels: line 1",
	} {
		assert.Contains(t, text, want)
	}
	assert.Equal(t, "v", d.Host.Labels["k"])
	assert.GreaterOrEqual(t, len(d.Host.Devices), 6, "the healthy GPUs are still found")
}

func TestPluginPanicIsAWarning(t *testing.T) {
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: treeDir("vm"),
		Plugins: []topology.Plugin{panicky{}, topology.NVIDIAPlugin()}})
	require.NoError(t, err)
	require.Len(t, d.Plugins, 2)
	assert.Contains(t, d.Plugins[0].Err, "panic: boom")
	assert.Contains(t, d.Warnings[len(d.Warnings)-1].String(), "panicky: plugin panicked")
}

type panicky struct{}

func (panicky) Name() string                                   { return "panicky" }
func (panicky) Maturity() topology.Maturity                    { return topology.Experimental }
func (panicky) Discover(context.Context, *topology.Scan) error { panic("boom") }

func TestDiscoverLive(t *testing.T) {
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{})
	require.NoError(t, err)
	require.NoError(t, d.Cluster().Validate())
	assert.NotEmpty(t, d.Host.NUMA)
	b, err := json.Marshal(d)
	require.NoError(t, err)
	assert.NotEmpty(t, b)
}

func BenchmarkDiscover(b *testing.B) {
	for _, fx := range topotest.Fixtures() {
		b.Run(fx.Name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				discoverFixture(b, fx)
			}
		})
	}
	b.Run("live", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := topology.Discover(context.Background(), topology.DiscoverConfig{}); err != nil {
				b.Fatal(err)
			}
		}
	})
}

func TestDiscoverSmallTrees(t *testing.T) {
	// A GB200 tray's view: 4 GPUs, an IMEX node list naming the domain.
	tmp := t.TempDir()
	tr := topotest.NewTree(tmp)
	tr.NUMANode(0, "0-71", []int{10, 40}, 1000).NUMANode(1, "72-143", []int{40, 10}, 1000)
	for g := 0; g < 4; g++ {
		hb := tr.HostBridge(fmt.Sprintf("%04x:00", 8+g))
		rp := tr.Bridge(hb, fmt.Sprintf("%04x:00:00.0", 8+g), 0x10de, 0x22b1, g/2, 32, 16)
		tr.PCI(rp, fmt.Sprintf("%04x:01:00.0", 8+g), topotest.PCI{Vendor: 0x10de, Device: 0x2941, Class: 0x030200, NUMA: g / 2, Driver: "nvidia"})
	}
	tr.File("etc/nvidia-imex/nodes_config.cfg", "10.0.0.2\n10.0.0.1\n# comment\n10.0.0.3")
	require.NoError(t, tr.Err())
	d, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: tmp, HostID: "tray1"})
	require.NoError(t, err)
	require.Len(t, d.Host.Devices, 4)
	assert.Equal(t, "B200-186GB", d.Host.Devices[0].Model)
	dom := d.Host.Labels[topology.LabelNVLinkDomain]
	assert.Regexp(t, `^imex-[0-9a-f]{8}$`, dom)
	assert.Empty(t, d.Host.Links, "no NVSwitch on PCI: nothing inferred")

	// The same list in another order names the same domain; an operator's
	// label wins.
	tr.File("etc/nvidia-imex/nodes_config.cfg", "10.0.0.3\n10.0.0.1\n10.0.0.2")
	d2, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: tmp})
	require.NoError(t, err)
	assert.Equal(t, dom, d2.Host.Labels[topology.LabelNVLinkDomain])
	d3, err := topology.Discover(context.Background(), topology.DiscoverConfig{Root: tmp,
		Labels: map[string]string{topology.LabelNVLinkDomain: "nvl72-r7"}})
	require.NoError(t, err)
	assert.Equal(t, "nvl72-r7", d3.Host.Labels[topology.LabelNVLinkDomain])

	// Intel Data Center GPU Max cards next to an integrated GPU.
	tmp = t.TempDir()
	tr = topotest.NewTree(tmp)
	hb := tr.HostBridge("0000:00")
	tr.PCI(hb, "0000:00:02.0", topotest.PCI{Vendor: 0x8086, Device: 0x4680, Class: 0x030000, NUMA: -1, Driver: "i915"})
	for i := 0; i < 2; i++ {
		dir := tr.PCI(hb, fmt.Sprintf("0000:%02x:00.0", 0x29+i), topotest.PCI{Vendor: 0x8086, Device: 0x0bd5, Class: 0x038000, NUMA: 0, Driver: "i915"})
		tr.Dir(fmt.Sprintf("%s/drm/renderD%d", dir, 129+i))
		tr.DevNode(fmt.Sprintf("dev/dri/renderD%d", 129+i))
	}
	require.NoError(t, tr.Err())
	d, err = topology.Discover(context.Background(), topology.DiscoverConfig{Root: tmp})
	require.NoError(t, err)
	require.Len(t, d.Host.Devices, 2)
	assert.Equal(t, "Max-1550-128GB", d.Host.Devices[1].Model)
	assert.Equal(t, "/dev/dri/renderD130", d.Host.Devices[1].DevNode)
}
