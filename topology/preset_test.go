package topology

import (
	"errors"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPresetsShape(t *testing.T) {
	tests := []struct {
		name    string
		devices int
		kind    DeviceKind
		rdma    int
		links   int
		pair    [2]int // a device pair and its expected path label
		label   string
	}{
		{"dgx-h100", 8, KindGPU, 8, 28, [2]int{0, 7}, "NV18"},
		{"dgx-b200", 8, KindGPU, 8, 28, [2]int{1, 6}, "NV18"},
		{"gb200-nvl72", 4, KindGPU, 4, 6, [2]int{0, 3}, "NV18"},
		{"mi355x", 8, KindGPU, 8, 28, [2]int{2, 5}, "XGMI"},
		{"tpu-v5p", 4, KindTPU, 0, 4, [2]int{0, 1}, "ICI"},
		{"trn2", 16, KindNeuron, 16, 32, [2]int{0, 1}, "NL"},
		{"gaudi3", 8, KindHPU, 8, 28, [2]int{0, 1}, "ROCE3"},
		{"rtx-pro-6000", 8, KindGPU, 4, 0, [2]int{0, 1}, "PIX"},
		{"tpu-ironwood", 4, KindTPU, 0, 4, [2]int{0, 1}, "ICI"},
	}
	require.Len(t, Presets(), len(tests))
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c, err := Preset(tt.name, 2)
			require.NoError(t, err)
			require.NoError(t, c.Validate())
			assert.NotEmpty(t, PresetDoc(tt.name))
			require.Len(t, c.Hosts, 2)
			assert.Equal(t, []string{"h0", "h1"}, c.HostIDs())
			h := c.Hosts[0]
			assert.True(t, h.Simulated)
			assert.Equal(t, tt.name, h.Preset)
			assert.Len(t, h.Devices, tt.devices)
			assert.Len(t, h.Links, tt.links)
			rdma := 0
			for _, n := range h.NICs {
				if n.RDMA() {
					rdma++
				}
			}
			assert.Equal(t, tt.rdma, rdma)
			for _, d := range h.Devices {
				assert.Equal(t, tt.kind, d.Kind)
				assert.Positive(t, d.MemoryBytes)
			}
			p := c.PathBetween(Endpoint{"h0", tt.pair[0]}, Endpoint{"h0", tt.pair[1]})
			assert.Equal(t, tt.label, p.String())
			assert.Equal(t, PathSELF, c.PathBetween(Endpoint{"h0", 0}, Endpoint{"h0", 0}).Class)
			if tt.rdma > 0 {
				nics := h.NearestNICs(0)
				require.NotEmpty(t, nics)
				assert.Equal(t, h.Devices[0].PCIeSwitch, nics[0].PCIeSwitch)
			}
		})
	}
}

func TestDGXH100Unchanged(t *testing.T) {
	c, err := Preset("dgx-h100", 1)
	require.NoError(t, err)
	h := c.Hosts[0]
	assert.Equal(t, "dgx-h100-x1", c.Name)
	assert.Equal(t, "rack0", h.Labels[LabelRack])
	assert.Equal(t, "H100-SXM5-80GB", h.Devices[3].Model)
	assert.Equal(t, 80*gib, h.Devices[3].MemoryBytes)
	assert.Equal(t, "mlx5_3", h.NICs[3].RDMADevice)
	assert.Equal(t, "sw3", h.NICs[3].PCIeSwitch)
	assert.Equal(t, 400.0, h.NICs[3].SpeedGbps)
	assert.Len(t, h.NUMA, 2)
	assert.Equal(t, PathPHB, h.pcieClass(0, 1)) // leaf switches under one root port
	assert.Equal(t, PathNODE, h.pcieClass(0, 2))
	assert.Equal(t, PathSYS, h.pcieClass(0, 4))
	assert.Equal(t, PathNET, c.PathBetween(Endpoint{"h0", 0}, Endpoint{"h1", 0}).Class)
}

func TestPresetErrors(t *testing.T) {
	_, err := Preset("nope", 1)
	assert.ErrorIs(t, err, ErrUnknownPreset)
	_, err = Preset("dgx-h100", 0)
	assert.ErrorIs(t, err, ErrBadSpec)
	_, err = PresetCluster("gb200-nvl72", 40, 20)
	assert.ErrorIs(t, err, ErrBadSpec)
	_, err = PresetCluster("dgx-h100", 4, -1)
	assert.ErrorIs(t, err, ErrBadSpec)
	_, err = NewCluster(ClusterSpec{Preset: "dgx-h100", Hosts: MaxPresetHosts + 1})
	assert.ErrorIs(t, err, ErrBadSpec)
	_, err = NewCluster(ClusterSpec{Preset: "dgx-h100", SliceShape: "2x2x4"})
	assert.ErrorIs(t, err, ErrBadSpec)
	for _, s := range []string{"", "2", "2x", "0x2x2", "2x2x2x2", "axb", "1x1x1", "3x3x4", "2x2x99999"} {
		_, err = NewCluster(ClusterSpec{Preset: "tpu-v5p", Hosts: 4, SliceShape: s + "!"})
		assert.ErrorIs(t, err, ErrBadSpec, s)
		if s != "" {
			_, err = NewCluster(ClusterSpec{Preset: "tpu-v5p", Hosts: 4, SliceShape: s})
			assert.True(t, errors.Is(err, ErrBadSpec), "shape %q", s)
		}
	}
}

func TestGB200Racks(t *testing.T) {
	c, err := PresetCluster("gb200-nvl72", 40, 0)
	require.NoError(t, err)
	nv := c.DomainsOf(DomainNVLink)
	require.Len(t, nv, 3)
	assert.Equal(t, "nvl72-0", nv[0].Name)
	assert.Len(t, nv[0].Hosts, 18)
	assert.Len(t, nv[0].Devices, 72)
	assert.Len(t, nv[2].Devices, 16) // 4 hosts in the last rack
	assert.Len(t, c.DomainsOf(DomainRack), 3)
	h17, _ := c.Host("h17")
	h18, _ := c.Host("h18")
	assert.Equal(t, "rack0", h17.Labels[LabelRack])
	assert.Equal(t, "rack1", h18.Labels[LabelRack])
	assert.Equal(t, "nvl72-1", h18.Labels[LabelNVLinkDomain])

	p := c.PathBetween(Endpoint{"h0", 1}, Endpoint{"h17", 2})
	assert.Equal(t, PathMNNVL, p.Class)
	assert.Equal(t, LinkNVLink, p.Link)
	assert.Equal(t, PathNET, c.PathBetween(Endpoint{"h17", 0}, Endpoint{"h18", 0}).Class)
	assert.Equal(t, PathNET, c.PathBetween(Endpoint{"h0", HostMemory}, Endpoint{"h1", 0}).Class)

	d, ok := c.DomainOf(Endpoint{"h20", 3}, DomainNVLink)
	require.True(t, ok)
	assert.Equal(t, "nvl72-1", d.Name)
	d, ok = c.DomainOf(Endpoint{"h20", HostMemory}, DomainRack)
	require.True(t, ok)
	assert.Equal(t, "rack1", d.Name)
}

func TestTPUSlices(t *testing.T) {
	c, err := NewCluster(ClusterSpec{Preset: "tpu-v5p", Hosts: 10})
	require.NoError(t, err)
	sl := c.DomainsOf(DomainSlice)
	require.Len(t, sl, 3)
	assert.Equal(t, []string{"h0", "h1", "h2", "h3"}, sl[0].Hosts)
	assert.Len(t, sl[0].Devices, 16)
	assert.Equal(t, []string{"h8", "h9"}, sl[2].Hosts)
	h0, _ := c.Host("h0")
	h9, _ := c.Host("h9")
	assert.Equal(t, "2x2x4", h0.Labels[LabelSliceShape])
	assert.Equal(t, "2x2x2", h9.Labels[LabelSliceShape])
	assert.Equal(t, "1", h9.Labels[LabelSliceWorker])
	assert.Empty(t, c.DomainsOf(DomainICI), "ICI inside a slice is reported as the slice")

	p := c.PathBetween(Endpoint{"h0", 0}, Endpoint{"h3", 3})
	assert.Equal(t, PathMNNVL, p.Class)
	assert.Equal(t, LinkICI, p.Link)
	assert.Equal(t, PathNET, c.PathBetween(Endpoint{"h3", 0}, Endpoint{"h4", 0}).Class)

	c, err = NewCluster(ClusterSpec{Preset: "tpu-v5p", Hosts: 8, SliceShape: "2x4x4", RacksPerBlock: 1, Zone: "us-east5-a"})
	require.NoError(t, err)
	assert.Len(t, c.DomainsOf(DomainSlice), 1)
	assert.Len(t, c.DomainsOf(DomainBlock), 1)
	assert.Len(t, c.DomainsOf(DomainZone), 1)
}

func TestDomainsSingleHost(t *testing.T) {
	for _, tt := range []struct {
		preset string
		kind   DomainKind
		n      int
	}{
		{"dgx-h100", DomainNVLink, 8},
		{"mi355x", DomainXGMI, 8},
		{"trn2", DomainNeuronLink, 16},
		{"gaudi3", DomainRoCE, 8},
	} {
		c, err := Preset(tt.preset, 2)
		require.NoError(t, err)
		ds := c.DomainsOf(tt.kind)
		require.Len(t, ds, 2, tt.preset)
		assert.Equal(t, "h1/"+string(tt.kind), ds[1].Name)
		assert.Len(t, ds[0].Devices, tt.n)
		assert.Equal(t, "h0/0", ds[0].DeviceIDs()[0])
	}
	var nilCluster *Cluster
	assert.Nil(t, nilCluster.Domains())
}

func TestDomainsSplitComponents(t *testing.T) {
	h := &Host{ID: "x", Devices: []Device{{Index: 0}, {Index: 1}, {Index: 2}, {Index: 3}, {Index: 4}},
		Links: []Link{{A: 0, B: 1, Kind: LinkNVLink}, {A: 2, B: 3, Kind: LinkNVLink}, {A: 3, B: 4, Kind: LinkPCIe}}}
	c := &Cluster{Hosts: []*Host{h}}
	ds := c.Domains()
	require.Len(t, ds, 2)
	assert.Equal(t, "x/nvlink", ds[0].Name)
	assert.Equal(t, "x/nvlink-1", ds[1].Name)
	assert.Equal(t, []string{"x/2", "x/3"}, ds[1].DeviceIDs())
}

func TestNilSafety(t *testing.T) {
	c := &Cluster{Hosts: []*Host{nil, {ID: "a"}}}
	assert.Equal(t, []string{"a"}, c.HostIDs())
	assert.NotPanics(t, func() { c.Domains() })
	assert.Equal(t, PathNET, c.PathBetween(Endpoint{"x", 0}, Endpoint{"a", 0}).Class)
	assert.Error(t, c.Validate())
	var h *Host
	assert.Nil(t, h.NearestNICs(0))
	_, ok := h.LinkBetween(0, 1)
	assert.False(t, ok)
	var nc *Cluster
	assert.Nil(t, nc.HostIDs())
	_, ok = nc.Host("a")
	assert.False(t, ok)
}

// The PCIe-only server: pairs under one switch are peer-to-peer over PCIe,
// the rest meet at the host bridge or across sockets (issue 19.11).
func TestRTXPro6000Paths(t *testing.T) {
	c, err := Preset("rtx-pro-6000", 1)
	require.NoError(t, err)
	for _, tc := range []struct {
		a, b  int
		class PathClass
		p2p   bool
	}{
		{0, 1, PathPIX, true},   // one switch
		{0, 2, PathNODE, false}, // two switches of one socket: host bridge
		{0, 7, PathSYS, false},  // across sockets
		{6, 7, PathPIX, true},
	} {
		p := c.PathBetween(Endpoint{"h0", tc.a}, Endpoint{"h0", tc.b})
		assert.Equal(t, tc.class, p.Class, "gpu%d-gpu%d", tc.a, tc.b)
		assert.Equal(t, tc.p2p, p.PeerToPeer(), "gpu%d-gpu%d", tc.a, tc.b)
		if tc.p2p {
			assert.Equal(t, 50.0, p.GBps)
		}
	}
	assert.False(t, c.PathBetween(Endpoint{"h0", 0}, Endpoint{"h0", HostMemory}).PeerToPeer())
	h, _ := c.Host("h0")
	assert.Empty(t, h.Links, "no NVLink")
	nics := h.NearestNICs(3)
	require.NotEmpty(t, nics)
	assert.Equal(t, "sw1", nics[0].PCIeSwitch, "each GPU pair's NIC is under its switch")
}

func TestIronwoodSlices(t *testing.T) {
	c, err := NewCluster(ClusterSpec{Preset: "tpu-ironwood", Hosts: 8})
	require.NoError(t, err)
	require.Len(t, c.DomainsOf(DomainSlice), 2)
	h0, _ := c.Host("h0")
	assert.Equal(t, int64(192)<<30, h0.Devices[0].MemoryBytes)
	assert.Len(t, h0.NICs, 2)
	assert.Equal(t, "2x2x4", h0.Labels[LabelSliceShape])
	p := c.PathBetween(Endpoint{"h0", 0}, Endpoint{"h3", 3})
	assert.Equal(t, PathMNNVL, p.Class)
	assert.Equal(t, LinkICI, p.Link)
	assert.Equal(t, PathNET, c.PathBetween(Endpoint{"h3", 0}, Endpoint{"h4", 0}).Class)
}
