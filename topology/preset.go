package topology

import (
	"errors"
	"fmt"
	"sort"
	"strconv"
	"strings"
)

// PresetFunc builds one host of a preset. i is the host's position in the
// cluster; the returned host has ID "h<i>".
type PresetFunc func(i int) *Host

// presetInfo describes a preset beyond its host builder: how hosts group
// into racks and device-fabric domains by default.
type presetInfo struct {
	build PresetFunc
	// hostsPerRack is the default rack size; 0 puts every host in rack0.
	hostsPerRack int
	// maxHostsPerRack bounds the rack size (0 = unbounded), e.g. an NVL72
	// rack holds at most 18 compute trays.
	maxHostsPerRack int
	// nvlinkRack labels each rack as one multi-node NVLink domain.
	nvlinkRack bool
	// tpuSlice groups hosts into TPU slices of DefaultSliceShape.
	tpuSlice bool
	// doc is the one-line summary shown by tensorlane topo --preset help.
	doc string
}

var presetInfos = map[string]presetInfo{
	"dgx-h100":     {build: dgxH100, doc: "NVIDIA DGX H100: 8 H100 80GB, NV18 all-to-all, 8x400Gb/s RDMA"},
	"dgx-b200":     {build: dgxB200, doc: "NVIDIA DGX B200: 8 B200 180GB, NV18 (NVLink 5) all-to-all, 8x400Gb/s RDMA"},
	"gb200-nvl72":  {build: gb200Tray, hostsPerRack: 18, maxHostsPerRack: 18, nvlinkRack: true, doc: "NVIDIA GB200 NVL72 compute tray: 2 Grace + 4 B200; 18 trays per rack form one NVLink domain"},
	"mi355x":       {build: mi355x, doc: "AMD Instinct MI355X platform: 8 MI355X 288GB, xGMI all-to-all, 8x400Gb/s RDMA"},
	"tpu-v5p":      {build: tpuV5p, hostsPerRack: 16, tpuSlice: true, doc: "Google TPU v5p host: 4 chips (2x2x1), ICI; hosts grouped into slices (default 2x2x4)"},
	"trn2":         {build: trn2, doc: "AWS trn2.48xlarge: 16 Trainium2, NeuronLink 4x4 torus, 16x200Gb/s EFA"},
	"gaudi3":       {build: gaudi3, doc: "Intel Gaudi 3 HLS: 8 Gaudi3 128GB, 3x200GbE RoCE to each peer, 3x200GbE scale-out each"},
	"rtx-pro-6000": {build: rtxPro6000, doc: "8x NVIDIA RTX PRO 6000 Blackwell Server Edition 96GB, PCIe Gen5 only (no NVLink): P2P under a switch, host memory across"},
	"tpu-ironwood": {build: tpuIronwood, hostsPerRack: 16, tpuSlice: true, doc: "Google TPU7x (Ironwood) host: 4 chips (2x2x1) of 192 GiB, ICI; hosts grouped into slices (default 2x2x4)"},
}

// presets is kept for code that looked up builders directly.
var presets = func() map[string]PresetFunc {
	m := make(map[string]PresetFunc, len(presetInfos))
	for n, p := range presetInfos {
		m[n] = p.build
	}
	return m
}()

// Errors of preset construction; match with errors.Is.
var (
	ErrUnknownPreset = errors.New("topology: unknown preset")
	ErrBadSpec       = errors.New("topology: bad cluster spec")
)

// MaxPresetHosts bounds the size of a preset cluster, so that a typo cannot
// ask for a model that does not fit in memory.
const MaxPresetHosts = 65536

// Labels that presets and discovery add besides the well-known placement
// labels.
const (
	// LabelSliceShape is a TPU slice's chip topology, e.g. "2x2x4".
	LabelSliceShape = "topology.tensorlane.io/slice-shape"
	// LabelSliceWorker is the host's worker index within its TPU slice.
	LabelSliceWorker = "topology.tensorlane.io/slice-worker"
)

// DefaultSliceShape is the TPU v5p slice shape used when a ClusterSpec
// names none: 16 chips on 4 hosts.
const DefaultSliceShape = "2x2x4"

// Presets returns the names of the built-in presets, sorted.
func Presets() []string {
	names := make([]string, 0, len(presetInfos))
	for n := range presetInfos {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// PresetDoc returns a one-line description of the named preset.
func PresetDoc(name string) string { return presetInfos[name].doc }

// ClusterSpec asks for a simulated cluster of identical preset hosts. Its
// zero value (with Preset set) means: one host, the preset's default rack
// size, no blocks, no zone.
type ClusterSpec struct {
	// Preset names the host model (see Presets).
	Preset string
	// Hosts is the number of hosts; 0 means 1.
	Hosts int
	// HostsPerRack fills racks of this many hosts in order (h0..h17 in
	// rack0, h18.. in rack1, ...). 0 uses the preset's default: 18 for
	// gb200-nvl72, 16 (one 4x4x4 cube) for tpu-v5p, and all hosts in rack0
	// for the others.
	HostsPerRack int
	// RacksPerBlock groups racks into blocks (LabelBlock "block0", ...);
	// 0 sets no block label.
	RacksPerBlock int
	// SliceShape is the TPU slice topology as chip counts per axis
	// ("2x2x4"); tpu-v5p only. Each slice holds chips/4 hosts; a last,
	// partial slice gets the shape 2x2x<k>. "" means DefaultSliceShape.
	SliceShape string
	// Zone, when set, becomes every host's LabelZone.
	Zone string
}

// Preset builds a simulated cluster of hosts identical hosts of the named
// preset, with the preset's default racks: see NewCluster. Hosts have IDs
// "h0".."h<n-1>", carry Simulated = true and a LabelRack.
func Preset(name string, hosts int) (*Cluster, error) {
	if hosts < 1 {
		return nil, fmt.Errorf("%w: preset %q: need at least one host, got %d", ErrBadSpec, name, hosts)
	}
	return NewCluster(ClusterSpec{Preset: name, Hosts: hosts})
}

// PresetCluster builds a multi-rack simulated cluster: hosts hosts of the
// named preset, hostsPerRack to a rack (0 = the preset's default). For
// gb200-nvl72 every rack is also one NVLink domain (LabelNVLinkDomain
// "nvl72-<rack>"), so hosts of one rack reach each other's GPUs with
// PathMNNVL; racks of gb200-nvl72 hold at most 18 hosts.
//
//	c, err := topology.PresetCluster("gb200-nvl72", 36, 0) // two NVL72 racks
func PresetCluster(name string, hosts, hostsPerRack int) (*Cluster, error) {
	if hosts < 1 {
		return nil, fmt.Errorf("%w: preset %q: need at least one host, got %d", ErrBadSpec, name, hosts)
	}
	if hostsPerRack < 0 {
		return nil, fmt.Errorf("%w: preset %q: negative hosts per rack %d", ErrBadSpec, name, hostsPerRack)
	}
	return NewCluster(ClusterSpec{Preset: name, Hosts: hosts, HostsPerRack: hostsPerRack})
}

// NewCluster builds the simulated cluster that spec describes. Labels:
// every host gets LabelRack ("rack<k>") and LabelAccelerator; gb200-nvl72
// hosts get LabelNVLinkDomain per rack; tpu-v5p hosts get LabelSlice
// ("slice<k>"), LabelSliceShape and LabelSliceWorker; RacksPerBlock adds
// LabelBlock and Zone LabelZone.
func NewCluster(spec ClusterSpec) (*Cluster, error) {
	info, ok := presetInfos[spec.Preset]
	if !ok {
		return nil, fmt.Errorf("%w %q (have %v)", ErrUnknownPreset, spec.Preset, Presets())
	}
	n := spec.Hosts
	if n == 0 {
		n = 1
	}
	switch {
	case n < 0:
		return nil, fmt.Errorf("%w: preset %q: need at least one host, got %d", ErrBadSpec, spec.Preset, n)
	case n > MaxPresetHosts:
		return nil, fmt.Errorf("%w: preset %q: %d hosts is more than %d", ErrBadSpec, spec.Preset, n, MaxPresetHosts)
	case spec.HostsPerRack < 0 || spec.RacksPerBlock < 0:
		return nil, fmt.Errorf("%w: preset %q: negative rack or block size", ErrBadSpec, spec.Preset)
	}
	perRack := spec.HostsPerRack
	if perRack == 0 {
		perRack = info.hostsPerRack
	}
	if info.maxHostsPerRack > 0 && perRack > info.maxHostsPerRack {
		return nil, fmt.Errorf("%w: preset %q: at most %d hosts per rack, got %d", ErrBadSpec, spec.Preset, info.maxHostsPerRack, perRack)
	}
	if spec.SliceShape != "" && !info.tpuSlice {
		return nil, fmt.Errorf("%w: preset %q has no TPU slices", ErrBadSpec, spec.Preset)
	}
	var hostsPerSlice int
	var sliceDims []int
	if info.tpuSlice {
		shape := spec.SliceShape
		if shape == "" {
			shape = DefaultSliceShape
		}
		dims, chips, err := ParseSliceShape(shape)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrBadSpec, err)
		}
		if chips%tpuChipsPerHost != 0 || dims[0]*dims[1]%tpuChipsPerHost != 0 {
			return nil, fmt.Errorf("%w: slice %q: want a multiple of 2x2 chips per host layer", ErrBadSpec, shape)
		}
		hostsPerSlice, sliceDims = chips/tpuChipsPerHost, dims
	}

	c := &Cluster{Name: fmt.Sprintf("%s-x%d", spec.Preset, n), Hosts: make([]*Host, 0, n)}
	for i := 0; i < n; i++ {
		h := info.build(i)
		h.ID = fmt.Sprintf("h%d", i)
		h.Preset = spec.Preset
		h.Simulated = true
		if h.Labels == nil {
			h.Labels = map[string]string{}
		}
		rack := 0
		if perRack > 0 {
			rack = i / perRack
		}
		h.Labels[LabelRack] = fmt.Sprintf("rack%d", rack)
		if spec.RacksPerBlock > 0 {
			h.Labels[LabelBlock] = fmt.Sprintf("block%d", rack/spec.RacksPerBlock)
		}
		if spec.Zone != "" {
			h.Labels[LabelZone] = spec.Zone
		}
		if info.nvlinkRack {
			h.Labels[LabelNVLinkDomain] = fmt.Sprintf("nvl72-%d", rack)
		}
		if info.tpuSlice {
			slice, worker := i/hostsPerSlice, i%hostsPerSlice
			h.Labels[LabelSlice] = fmt.Sprintf("slice%d", slice)
			h.Labels[LabelSliceWorker] = strconv.Itoa(worker)
			dims := sliceDims
			if rest := n - slice*hostsPerSlice; rest < hostsPerSlice {
				// A trailing partial slice: whole hosts stacked along z.
				dims = []int{2, 2, rest}
			}
			h.Labels[LabelSliceShape] = formatShape(dims)
		}
		c.Hosts = append(c.Hosts, h)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return c, nil
}

// ParseSliceShape parses a TPU slice topology such as "2x2x4" into its
// axis sizes and chip count. It accepts 2 or 3 positive axes.
func ParseSliceShape(s string) (dims []int, chips int, err error) {
	parts := strings.Split(s, "x")
	if len(parts) < 2 || len(parts) > 3 {
		return nil, 0, fmt.Errorf("topology: slice shape %q: want AxB or AxBxC", s)
	}
	chips = 1
	for _, p := range parts {
		v, err := strconv.Atoi(p)
		if err != nil || v < 1 || v > 1024 {
			return nil, 0, fmt.Errorf("topology: slice shape %q: bad axis %q", s, p)
		}
		dims = append(dims, v)
		chips *= v
	}
	if len(dims) == 2 {
		dims = append(dims, 1)
	}
	if chips > 1<<16 {
		return nil, 0, fmt.Errorf("topology: slice shape %q: %d chips is too many", s, chips)
	}
	return dims, chips, nil
}

func formatShape(d []int) string {
	s := make([]string, len(d))
	for i, v := range d {
		s[i] = strconv.Itoa(v)
	}
	return strings.Join(s, "x")
}

const gib = int64(1) << 30

// eightGPUBoard is the common layout of 8-accelerator boards (DGX/HGX,
// MI3xx platforms, Gaudi HLS): two sockets, four root ports, one PCIe switch
// per accelerator that also holds that accelerator's NIC.
type eightGPUBoard struct {
	label, vendor, model string
	kind                 DeviceKind
	mem                  int64
	cpus                 [2]string
	nodeMem              int64
	nicName              func(g int) string
	rdmaName             func(g int) string
	nicGbps              float64
	link                 Link // template for the all-to-all links (A, B ignored)
}

func (b eightGPUBoard) host(i int) *Host {
	h := &Host{
		ID:     fmt.Sprintf("h%d", i),
		Labels: map[string]string{LabelAccelerator: b.label},
		NUMA: []NUMANode{
			{ID: 0, CPUs: b.cpus[0], MemoryBytes: b.nodeMem, Distances: []int{10, 21}},
			{ID: 1, CPUs: b.cpus[1], MemoryBytes: b.nodeMem, Distances: []int{21, 10}},
		},
	}
	for rp := 0; rp < 4; rp++ {
		h.Switches = append(h.Switches, PCIeSwitch{ID: fmt.Sprintf("rp%d", rp), NUMA: rp / 2})
	}
	for g := 0; g < 8; g++ {
		sw := fmt.Sprintf("sw%d", g)
		numa := g / 4
		h.Switches = append(h.Switches, PCIeSwitch{ID: sw, NUMA: numa, Parent: fmt.Sprintf("rp%d", g/2)})
		h.Devices = append(h.Devices, Device{
			Index: g, Kind: b.kind, Vendor: b.vendor, Model: b.model,
			MemoryBytes: b.mem, NUMA: numa, PCIeSwitch: sw,
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x18+g*0x10),
		})
		h.NICs = append(h.NICs, NIC{
			Name: b.nicName(g), RDMADevice: b.rdmaName(g),
			SpeedGbps: b.nicGbps, NUMA: numa, PCIeSwitch: sw,
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x18+g*0x10+1),
		})
	}
	for a := 0; a < 8; a++ {
		for c := a + 1; c < 8; c++ {
			l := b.link
			l.A, l.B = a, c
			h.Links = append(h.Links, l)
		}
	}
	return h
}

func cx7Name(g int) string  { return fmt.Sprintf("ibp%ds0", 0x18+g*0x10+1) }
func mlx5Name(g int) string { return fmt.Sprintf("mlx5_%d", g) }

// dgxH100 models an NVIDIA DGX H100: 8 H100 SXM5 80 GB GPUs all joined by
// NVSwitch (NV18, 450 GB/s each way), 2 NUMA nodes, and 8 ConnectX-7 400 Gb/s
// RDMA NICs, each under the same PCIe switch as one GPU. Two leaf switches
// share each of four root ports, two root ports per socket.
func dgxH100(i int) *Host {
	return eightGPUBoard{
		label: "H100", vendor: "nvidia", model: "H100-SXM5-80GB", kind: KindGPU, mem: 80 * gib,
		cpus: [2]string{"0-55,112-167", "56-111,168-223"}, nodeMem: 1024 * gib,
		nicName: cx7Name, rdmaName: mlx5Name, nicGbps: 400,
		link: Link{Kind: LinkNVLink, Lanes: 18, GBps: 450},
	}.host(i)
}

// dgxB200 models an NVIDIA DGX B200: 8 B200 180 GB GPUs on fifth-generation
// NVLink (NV18, 900 GB/s each way), two Xeon 8570 sockets, 8 ConnectX-7
// 400 Gb/s NICs, laid out like the DGX H100.
func dgxB200(i int) *Host {
	return eightGPUBoard{
		label: "B200", vendor: "nvidia", model: "B200-SXM-180GB", kind: KindGPU, mem: 180 * gib,
		cpus: [2]string{"0-55,112-167", "56-111,168-223"}, nodeMem: 1024 * gib,
		nicName: cx7Name, rdmaName: mlx5Name, nicGbps: 400,
		link: Link{Kind: LinkNVLink, Lanes: 18, GBps: 900},
	}.host(i)
}

// mi355x models an 8-GPU AMD Instinct MI355X platform: 8 MI355X 288 GB GPUs
// joined all-to-all by one xGMI (Infinity Fabric) link per pair (76.8 GB/s
// each way), two EPYC sockets, 8 400 Gb/s RDMA NICs (Pollara-class, verbs
// names ionic_N), each under one GPU's PCIe switch.
func mi355x(i int) *Host {
	return eightGPUBoard{
		label: "MI355X", vendor: "amd", model: "MI355X-288GB", kind: KindGPU, mem: 288 * gib,
		cpus: [2]string{"0-63,128-191", "64-127,192-255"}, nodeMem: 1536 * gib,
		nicName:  func(g int) string { return fmt.Sprintf("benic%dp1", g+1) },
		rdmaName: func(g int) string { return fmt.Sprintf("ionic_%d", g) },
		nicGbps:  400,
		link:     Link{Kind: LinkXGMI, Lanes: 1, GBps: 76.8},
	}.host(i)
}

// gaudi3 models an Intel Gaudi 3 HLS board: 8 Gaudi3 128 GB accelerators,
// each with 24 200 GbE RoCE ports on the chip: 21 joined all-to-all for
// scale-up (3 per peer, 75 GB/s each way) and 3 for scale-out, modelled as
// one 600 Gb/s RDMA NIC (verbs device hbl_N) under the accelerator's switch.
func gaudi3(i int) *Host {
	return eightGPUBoard{
		label: "Gaudi3", vendor: "intel", model: "Gaudi3-HL-325L-128GB", kind: KindHPU, mem: 128 * gib,
		cpus: [2]string{"0-59,120-179", "60-119,180-239"}, nodeMem: 1024 * gib,
		nicName:  func(g int) string { return fmt.Sprintf("gaudi%d-so", g) },
		rdmaName: func(g int) string { return fmt.Sprintf("hbl_%d", g) },
		nicGbps:  600,
		link:     Link{Kind: LinkRoCE, Lanes: 3, GBps: 75},
	}.host(i)
}

// gb200Tray models one compute tray of an NVIDIA GB200 NVL72 rack: two Grace
// CPUs (one NUMA node each, 72 cores), four B200 GPUs (186 GB HBM3e) two per
// Grace over NVLink-C2C, all four on fifth-generation NVLink through the
// rack's NVSwitch trays (NV18, 900 GB/s each way), and four ConnectX-7
// 400 Gb/s NICs, one beside each GPU. The GPUs of all 18 trays of a rack
// share one NVLink domain (see NewCluster).
func gb200Tray(i int) *Host {
	h := &Host{
		ID:     fmt.Sprintf("h%d", i),
		Labels: map[string]string{LabelAccelerator: "GB200"},
		NUMA: []NUMANode{
			{ID: 0, CPUs: "0-71", MemoryBytes: 480 * 1e9, Distances: []int{10, 40}},
			{ID: 1, CPUs: "72-143", MemoryBytes: 480 * 1e9, Distances: []int{40, 10}},
		},
	}
	for g := 0; g < 4; g++ {
		numa := g / 2
		rp := fmt.Sprintf("rp%d", g)
		h.Switches = append(h.Switches, PCIeSwitch{ID: rp, NUMA: numa})
		h.Devices = append(h.Devices, Device{
			Index: g, Kind: KindGPU, Vendor: "nvidia", Model: "B200-186GB",
			MemoryBytes: 186 * gib, NUMA: numa, PCIeSwitch: rp,
			BusID: fmt.Sprintf("%04x:01:00.0", 0x0008+g*0x0001),
		})
		h.NICs = append(h.NICs, NIC{
			Name: fmt.Sprintf("ibp%ds0", 3+g), RDMADevice: fmt.Sprintf("mlx5_%d", g),
			SpeedGbps: 400, NUMA: numa, PCIeSwitch: rp,
			BusID: fmt.Sprintf("%04x:03:00.0", g*0x0002),
		})
	}
	for a := 0; a < 4; a++ {
		for b := a + 1; b < 4; b++ {
			h.Links = append(h.Links, Link{A: a, B: b, Kind: LinkNVLink, Lanes: 18, GBps: 900})
		}
	}
	return h
}

const tpuChipsPerHost = 4

// tpuV5p models one Google TPU v5p host: 4 chips (95 GB HBM each) laid out
// 2x2, each joined to its x and y neighbour by ICI (50 GB/s each way per
// link; the z links leave the host towards the next worker of the slice),
// two NUMA nodes, and a 200 Gb/s data-centre NIC without RDMA.
func tpuV5p(i int) *Host {
	h := &Host{
		ID:     fmt.Sprintf("h%d", i),
		Labels: map[string]string{LabelAccelerator: "tpu-v5p"},
		NUMA: []NUMANode{
			{ID: 0, CPUs: "0-51,104-155", MemoryBytes: 224 * gib, Distances: []int{10, 20}},
			{ID: 1, CPUs: "52-103,156-207", MemoryBytes: 224 * gib, Distances: []int{20, 10}},
		},
	}
	for c := 0; c < tpuChipsPerHost; c++ {
		numa := c / 2
		rp := fmt.Sprintf("rp%d", c)
		h.Switches = append(h.Switches, PCIeSwitch{ID: rp, NUMA: numa})
		h.Devices = append(h.Devices, Device{
			Index: c, Kind: KindTPU, Vendor: "google", Model: "TPU-v5p",
			MemoryBytes: 95 * gib, NUMA: numa, PCIeSwitch: rp,
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x05+c),
		})
	}
	h.Switches = append(h.Switches, PCIeSwitch{ID: "rp-nic", NUMA: 0})
	h.NICs = []NIC{{Name: "ens8", SpeedGbps: 200, NUMA: 0, PCIeSwitch: "rp-nic", BusID: "0000:00:08.0"}}
	// chips (x,y): 0=(0,0) 1=(1,0) 2=(0,1) 3=(1,1)
	for _, p := range [][2]int{{0, 1}, {2, 3}, {0, 2}, {1, 3}} {
		h.Links = append(h.Links, Link{A: p[0], B: p[1], Kind: LinkICI, Lanes: 1, GBps: 50})
	}
	return h
}

// trn2 models an AWS trn2.48xlarge: 16 Trainium2 chips (96 GB HBM each) in a
// 4x4 NeuronLink torus (each chip linked to its four neighbours, 128 GB/s
// each way per link), two NUMA nodes, and 16 200 Gb/s EFA RDMA devices, one
// beside each chip.
func trn2(i int) *Host {
	h := &Host{
		ID:     fmt.Sprintf("h%d", i),
		Labels: map[string]string{LabelAccelerator: "trainium2"},
		NUMA: []NUMANode{
			{ID: 0, CPUs: "0-47,96-143", MemoryBytes: 1024 * gib, Distances: []int{10, 32}},
			{ID: 1, CPUs: "48-95,144-191", MemoryBytes: 1024 * gib, Distances: []int{32, 10}},
		},
	}
	for rp := 0; rp < 4; rp++ {
		h.Switches = append(h.Switches, PCIeSwitch{ID: fmt.Sprintf("rp%d", rp), NUMA: rp / 2})
	}
	for c := 0; c < 16; c++ {
		numa := c / 8
		sw := fmt.Sprintf("sw%d", c/2)
		if c%2 == 0 {
			h.Switches = append(h.Switches, PCIeSwitch{ID: sw, NUMA: numa, Parent: fmt.Sprintf("rp%d", c/4)})
		}
		bus := 0x10 + c*0x08
		h.Devices = append(h.Devices, Device{
			Index: c, Kind: KindNeuron, Vendor: "aws", Model: "Trainium2",
			MemoryBytes: 96 * gib, NUMA: numa, PCIeSwitch: sw,
			BusID: fmt.Sprintf("0000:%02x:00.0", bus),
		})
		h.NICs = append(h.NICs, NIC{
			Name: fmt.Sprintf("rdmap%ds0", bus+1), RDMADevice: fmt.Sprintf("rdmap%ds0", bus+1),
			SpeedGbps: 200, NUMA: numa, PCIeSwitch: sw,
			BusID: fmt.Sprintf("0000:%02x:00.0", bus+1),
		})
	}
	for c := 0; c < 16; c++ {
		x, y := c%4, c/4
		right := y*4 + (x+1)%4
		down := ((y+1)%4)*4 + x
		for _, n := range []int{right, down} {
			a, b := c, n
			if a > b {
				a, b = b, a
			}
			h.Links = append(h.Links, Link{A: a, B: b, Kind: LinkNeuronLink, Lanes: 1, GBps: 128})
		}
	}
	sort.Slice(h.Links, func(i, j int) bool {
		if h.Links[i].A != h.Links[j].A {
			return h.Links[i].A < h.Links[j].A
		}
		return h.Links[i].B < h.Links[j].B
	})
	return h
}

// rtxPro6000 models a PCIe-only server of 8 NVIDIA RTX PRO 6000 Blackwell
// Server Edition GPUs (96 GB GDDR7, PCIe Gen5 x16, no NVLink), laid out like
// NVIDIA's RTX PRO Server reference design: two sockets, two PCIe switches
// per socket (the ConnectX-8 SuperNIC's, or a standalone Gen5 switch), each
// with two GPUs and one 400 Gb/s RDMA NIC. GPUs under one switch copy to
// each other over PCIe (P2P, about 50 GB/s each way on Gen5 x16); any other
// pair goes through the host bridge, which the planner treats as staging in
// host memory (shm, or a local copy in one process), as NCCL does by
// default above PXB.
func rtxPro6000(i int) *Host {
	h := &Host{
		ID: fmt.Sprintf("h%d", i),
		Labels: map[string]string{
			LabelAccelerator: "RTX-PRO-6000",
			LabelPCIeP2P:     "PXB:50",
		},
		NUMA: []NUMANode{
			{ID: 0, CPUs: "0-63,128-191", MemoryBytes: 1024 * gib, Distances: []int{10, 32}},
			{ID: 1, CPUs: "64-127,192-255", MemoryBytes: 1024 * gib, Distances: []int{32, 10}},
		},
	}
	for sw := 0; sw < 4; sw++ {
		numa := sw / 2
		rp, id := fmt.Sprintf("rp%d", sw), fmt.Sprintf("sw%d", sw)
		h.Switches = append(h.Switches, PCIeSwitch{ID: rp, NUMA: numa}, PCIeSwitch{ID: id, NUMA: numa, Parent: rp})
		for k := 0; k < 2; k++ {
			g := 2*sw + k
			h.Devices = append(h.Devices, Device{
				Index: g, Kind: KindGPU, Vendor: "nvidia", Model: "RTX-PRO-6000-Blackwell-SE-96GB",
				MemoryBytes: 96 * gib, NUMA: numa, PCIeSwitch: id,
				BusID: fmt.Sprintf("0000:%02x:00.0", 0x18+g*0x10),
			})
		}
		h.NICs = append(h.NICs, NIC{
			Name: fmt.Sprintf("ibp%ds0", 0x20+sw*0x20), RDMADevice: mlx5Name(sw),
			SpeedGbps: 400, NUMA: numa, PCIeSwitch: id,
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x20+sw*0x20),
		})
	}
	return h
}

// tpuIronwood models one Google TPU7x (Ironwood) VM: 4 chips (192 GiB HBM
// each) laid out 2x2, each joined to its x and y neighbour by ICI (the z
// links leave the host towards the next worker of the slice), two NUMA
// nodes with one data-centre NIC each (no RDMA). ICI per link, each way:
// Google gives 1.2 TB/s bidirectional per chip over the six links of a 3D
// torus, so 100 GB/s.
func tpuIronwood(i int) *Host {
	h := &Host{
		ID:     fmt.Sprintf("h%d", i),
		Labels: map[string]string{LabelAccelerator: "tpu7x"},
		NUMA: []NUMANode{
			{ID: 0, CPUs: "0-47,96-143", MemoryBytes: 480 * gib, Distances: []int{10, 20}},
			{ID: 1, CPUs: "48-95,144-191", MemoryBytes: 480 * gib, Distances: []int{20, 10}},
		},
	}
	for c := 0; c < tpuChipsPerHost; c++ {
		numa := c / 2
		rp := fmt.Sprintf("rp%d", c)
		h.Switches = append(h.Switches, PCIeSwitch{ID: rp, NUMA: numa})
		h.Devices = append(h.Devices, Device{
			Index: c, Kind: KindTPU, Vendor: "google", Model: "TPU7x-Ironwood",
			MemoryBytes: 192 * gib, NUMA: numa, PCIeSwitch: rp,
			BusID: fmt.Sprintf("0000:%02x:00.0", 0x05+c),
		})
	}
	for n := 0; n < 2; n++ {
		rp := fmt.Sprintf("rp-nic%d", n)
		h.Switches = append(h.Switches, PCIeSwitch{ID: rp, NUMA: n})
		h.NICs = append(h.NICs, NIC{Name: fmt.Sprintf("ens%d", 8+n), SpeedGbps: 200, NUMA: n, PCIeSwitch: rp, BusID: fmt.Sprintf("0000:%02x:00.0", 0x08+n)})
	}
	for _, p := range [][2]int{{0, 1}, {2, 3}, {0, 2}, {1, 3}} {
		h.Links = append(h.Links, Link{A: p[0], B: p[1], Kind: LinkICI, Lanes: 1, GBps: 100})
	}
	return h
}
