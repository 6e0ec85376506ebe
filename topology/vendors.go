package topology

import (
	"context"
	"fmt"
	"hash/fnv"
	"sort"
	"strconv"
	"strings"
)

// chipInfo is what a PCI device id tells about an accelerator.
type chipInfo struct {
	model string
	mem   int64
	// Device-fabric defaults, used when the fabric itself cannot be read:
	lanes int     // links between each pair on a fully connected board
	gbps  float64 // per pair, one direction
	board int     // fully connected board size the defaults apply to
}

// NVIDIA data-centre GPUs by PCI device id. Memory is the marketed size.
var nvidiaChips = map[uint16]chipInfo{
	0x20b0: {"A100-SXM4-40GB", 40 * gib, 12, 300, 8},
	0x20b2: {"A100-SXM4-80GB", 80 * gib, 12, 300, 8},
	0x20b5: {"A100-PCIE-80GB", 80 * gib, 0, 0, 0},
	0x2330: {"H100-SXM5-80GB", 80 * gib, 18, 450, 8},
	0x2331: {"H100-PCIe-80GB", 80 * gib, 0, 0, 0},
	0x2335: {"H200-SXM-141GB", 141 * gib, 18, 450, 8},
	0x233b: {"H200-NVL-141GB", 141 * gib, 0, 0, 0},
	0x2342: {"GH200-96GB", 96 * gib, 0, 0, 0},
	0x26b9: {"L40S-48GB", 48 * gib, 0, 0, 0},
	0x2901: {"B200-SXM-180GB", 180 * gib, 18, 900, 8},
	0x2941: {"B200-186GB", 186 * gib, 18, 900, 4},
}

// AMD Instinct accelerators by PCI device id.
var amdChips = map[uint16]chipInfo{
	0x738c: {"MI100-32GB", 32 * gib, 1, 46, 4},
	0x740c: {"MI250X-GCD-64GB", 64 * gib, 1, 50, 8},
	0x740f: {"MI210-64GB", 64 * gib, 1, 50, 4},
	0x74a0: {"MI300A-128GB", 128 * gib, 1, 64, 4},
	0x74a1: {"MI300X-192GB", 192 * gib, 1, 64, 8},
	0x74a5: {"MI325X-256GB", 256 * gib, 1, 64, 8},
	0x75a0: {"MI350X-288GB", 288 * gib, 1, 76.8, 8},
	0x75a3: {"MI355X-288GB", 288 * gib, 1, 76.8, 8},
}

// Google TPU chips by PCI device id (vendor 0x1ae0).
var tpuChips = map[uint16]chipInfo{
	0x005e: {"TPU-v4", 32 * gib, 1, 50, 4},
	0x0062: {"TPU-v5p", 95 * gib, 1, 50, 4},
	0x0063: {"TPU-v5e", 16 * gib, 1, 50, 8},
	0x006f: {"TPU-v6e", 32 * gib, 1, 100, 8},
}

// AWS Neuron devices by PCI device id (vendor 0x1d0f).
var neuronChips = map[uint16]chipInfo{
	0x7064: {"Inferentia", 8 * gib, 1, 0, 0},
	0x7164: {"Trainium", 32 * gib, 1, 96, 0},
	0x7264: {"Inferentia2", 32 * gib, 1, 96, 0},
	0x7364: {"Trainium2", 96 * gib, 1, 128, 0},
}

// Habana / Intel Gaudi by PCI device id (vendor 0x1da3).
var gaudiChips = map[uint16]chipInfo{
	0x1000: {"Gaudi-32GB", 32 * gib, 3, 12.5 * 3, 8},
	0x1020: {"Gaudi2-96GB", 96 * gib, 3, 37.5, 8},
	0x1060: {"Gaudi3-128GB", 128 * gib, 3, 75, 8},
}

// Intel data-centre GPUs by PCI device id (vendor 0x8086).
var intelGPUChips = map[uint16]chipInfo{
	0x0bd5: {"Max-1550-128GB", 128 * gib, 0, 0, 0},
	0x0bd6: {"Max-1550-128GB", 128 * gib, 0, 0, 0},
	0x0bda: {"Max-1100-48GB", 48 * gib, 0, 0, 0},
	0x56c0: {"Flex-170-16GB", 16 * gib, 0, 0, 0},
	0x56c1: {"Flex-140-12GB", 12 * gib, 0, 0, 0},
}

// basePlugin carries what every built-in plugin shares.
type basePlugin struct {
	name     string
	maturity Maturity
	vendors  []uint16
}

func (p *basePlugin) Name() string        { return p.name }
func (p *basePlugin) Maturity() Maturity  { return p.maturity }
func (p *basePlugin) VendorIDs() []uint16 { return append([]uint16(nil), p.vendors...) }

// addChips adds the vendor's functions that the table (or, for unknown ids,
// accept) names as accelerators, in address order, and returns their
// indices keyed by PCI address.
func addChips(s *Scan, vendor uint16, kind DeviceKind, vname string, table map[uint16]chipInfo,
	accept func(PCIFunction) bool) (idx []int, infos []chipInfo, fns []PCIFunction) {
	for _, fn := range s.Functions(vendor) {
		info, known := table[fn.Device]
		if !known {
			if accept == nil || !accept(fn) {
				continue
			}
			info = chipInfo{model: fmt.Sprintf("%s-%04x", vname, fn.Device)}
			s.Warn("sys/bus/pci/devices/"+fn.Address, "unknown %s device id 0x%04x; memory size unknown", vname, fn.Device)
		}
		f := fn
		i := s.AddDevice(Device{Kind: kind, Vendor: vname, Model: info.model, MemoryBytes: info.mem}, &f)
		if i < 0 {
			continue
		}
		idx, infos, fns = append(idx, i), append(infos, info), append(fns, fn)
	}
	return idx, infos, fns
}

// allToAll links every pair of idx with the given template.
func allToAll(s *Scan, idx []int, l Link) {
	for a := 0; a < len(idx); a++ {
		for b := a + 1; b < len(idx); b++ {
			m := l
			m.A, m.B = idx[a], idx[b]
			s.AddLink(m)
		}
	}
}

func isGPUClass(fn PCIFunction) bool {
	switch fn.ClassCode() {
	case ClassVGA, ClassDisplay3D, ClassDisplayOth, ClassAccelerator:
		return true
	}
	return false
}

// ---- NVIDIA ----

type nvidiaPlugin struct {
	basePlugin
	nvml nvmlReader // nil: the live library, read only when discovering this machine
}

// NVIDIAPlugin discovers NVIDIA GPUs from PCI (vendor 0x10de, display and
// 3D classes) and NVSwitches (class 0x0680). Without NVML it infers
// NVLink all-to-all on boards that carry NVSwitches, from the GPU model,
// and says so in a warning; NVLink peers and the fabric clique (the NVL72
// domain) come from NVML or, without it, from the LabelNVLinkDomain label.
func NVIDIAPlugin() Plugin {
	return &nvidiaPlugin{basePlugin: basePlugin{name: "nvidia", maturity: Beta, vendors: []uint16{VendorNVIDIA}}}
}

func (p *nvidiaPlugin) Discover(ctx context.Context, s *Scan) error {
	idx, infos, fns := addChips(s, VendorNVIDIA, KindGPU, "nvidia", nvidiaChips, isGPUClass)
	if len(idx) == 0 {
		return nil
	}
	switches := 0
	for _, fn := range s.Functions(VendorNVIDIA) {
		if fn.ClassCode() == ClassBridgeOther {
			switches++
			s.Claim(fn.Address)
		}
	}
	for k, i := range idx {
		d := &s.Host.Devices[i]
		d.DevNode = nvidiaDevNode(s, fns[k].Address, k)
		if u, err := s.FS.ReadAttr("proc/driver/nvidia/gpus/" + fns[k].Address + "/information"); err == nil {
			for _, line := range strings.Split(u, "\n") {
				if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "GPU UUID" {
					d.UUID = strings.TrimSpace(v)
				}
			}
		}
	}
	// An IMEX node list marks the hosts of one multi-node NVLink domain.
	if dom := imexDomain(s); dom != "" {
		if _, set := s.Host.Labels[LabelNVLinkDomain]; !set {
			s.SetLabel(LabelNVLinkDomain, dom)
			s.Warn(imexNodes, "NVLink domain %s taken from the IMEX node list (NVML fabric clique not read)", dom)
		}
	}
	if p.readNVML(s, idx, fns, infos) {
		return nil
	}
	info := infos[0]
	same := true
	for _, in := range infos {
		same = same && in.model == info.model
	}
	if switches > 0 && same && info.lanes > 0 && len(idx) <= info.board {
		allToAll(s, idx, Link{Kind: LinkNVLink, Lanes: info.lanes, GBps: info.gbps})
		s.Warn("", "NVLink all-to-all (NV%d) inferred from %d NVSwitch(es) and the GPU model", info.lanes, switches)
	}
	return nil
}

// readNVML applies NVML's view when it can be had and reports whether it
// described the NVLinks; otherwise it says why not, and the caller infers.
func (p *nvidiaPlugin) readNVML(s *Scan, idx []int, fns []PCIFunction, infos []chipInfo) bool {
	read := p.nvml
	if read == nil {
		if s.FS.Root() != "/" {
			s.Warn("", "NVML not used (discovery root is a saved tree, not this machine): NVLink peers and fabric clique not read; PCI-only")
			return false
		}
		read = liveNVML
	}
	gpus, err := read()
	if err != nil {
		s.Warn("", "NVML not used (%v): NVLink peers and fabric clique not read; PCI-only", err)
		return false
	}
	return applyNVML(s, idx, fns, infos, gpus)
}

const imexNodes = "etc/nvidia-imex/nodes_config.cfg"

// imexDomain names the NVLink domain after the IMEX node list (one address
// per line), "" when there is none.
func imexDomain(s *Scan) string {
	text, err := s.FS.ReadAttr(imexNodes)
	if err != nil {
		return ""
	}
	var nodes []string
	for _, l := range strings.Split(text, "\n") {
		l = strings.TrimSpace(l)
		if l != "" && !strings.HasPrefix(l, "#") && len(l) < 256 {
			nodes = append(nodes, l)
		}
	}
	if len(nodes) < 2 {
		return ""
	}
	sort.Strings(nodes)
	h := fnv.New32a()
	for _, n := range nodes {
		h.Write([]byte(n + "\n"))
	}
	return fmt.Sprintf("imex-%08x", h.Sum32())
}

func nvidiaDevNode(s *Scan, addr string, k int) string {
	info, err := s.FS.ReadAttr("proc/driver/nvidia/gpus/" + addr + "/information")
	minor := k
	if err == nil {
		for _, line := range strings.Split(info, "\n") {
			if key, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(key) == "Device Minor" {
				if m, err := strconv.Atoi(strings.TrimSpace(v)); err == nil && m >= 0 && m < 1<<16 {
					minor = m
				}
			}
		}
	}
	n := "dev/nvidia" + strconv.Itoa(minor)
	if s.FS.Exists(n) {
		return "/" + n
	}
	return ""
}

// ---- AMD ----

type amdPlugin struct{ basePlugin }

// AMDPlugin discovers AMD Instinct GPUs from PCI (vendor 0x1002) and the
// KFD topology in sysfs (sys/class/kfd/kfd/topology/nodes): memory size,
// xGMI hive id and xGMI links with their bandwidth. Without KFD it is
// PCI-only and says so.
func AMDPlugin() Plugin {
	return &amdPlugin{basePlugin{name: "amd", maturity: Alpha, vendors: []uint16{VendorAMD}}}
}

func (p *amdPlugin) Discover(ctx context.Context, s *Scan) error {
	accept := func(fn PCIFunction) bool {
		// Instinct parts are 0x1200 or 0x0380; leave Radeon display GPUs of
		// class 0x0300 with unknown ids alone (an APU's iGPU, say).
		return fn.ClassCode() == ClassAccelerator || fn.ClassCode() == ClassDisplayOth
	}
	idx, infos, fns := addChips(s, VendorAMD, KindGPU, "amd", amdChips, accept)
	if len(idx) == 0 {
		return nil
	}
	byAddr := map[string]int{}
	for k, fn := range fns {
		byAddr[fn.Address] = idx[k]
	}
	const kfd = "sys/class/kfd/kfd/topology/nodes"
	nodes := s.FS.Glob(kfd, "")
	if len(nodes) == 0 {
		s.Warn(kfd, "no KFD topology (amdgpu not loaded?): xGMI links and memory from the device table")
		if len(idx) > 1 && len(idx) <= infos[0].board {
			allToAll(s, idx, Link{Kind: LinkXGMI, Lanes: infos[0].lanes, GBps: infos[0].gbps})
			s.Warn(kfd, "xGMI all-to-all inferred from the GPU model")
		}
		return nil
	}
	kfdToDev := map[string]int{}
	for _, n := range nodes {
		props, err := readProps(s, kfd+"/"+n+"/properties")
		if err != nil {
			s.Warn(kfd+"/"+n+"/properties", "unreadable: %v", errText(err))
			continue
		}
		if props["simd_count"] == 0 {
			continue // a CPU node
		}
		loc := props["location_id"]
		addr := fmt.Sprintf("%04x:%02x:%02x.%x", props["domain"], loc>>8&0xff, loc>>3&0x1f, loc&7)
		i, ok := byAddr[addr]
		if !ok {
			s.Warn(kfd+"/"+n, "GPU node at %s matches no PCI device", addr)
			continue
		}
		kfdToDev[n] = i
		d := &s.Host.Devices[i]
		if h := props["hive_id"]; h != 0 {
			d.Fabric = fmt.Sprintf("xgmi-hive-%x", h)
		}
		if u := props["unique_id"]; u != 0 {
			d.UUID = fmt.Sprintf("GPU-%016x", u)
		}
		if m := props["drm_render_minor"]; m > 0 && m < 1<<16 && s.FS.Exists(fmt.Sprintf("dev/dri/renderD%d", m)) {
			d.DevNode = fmt.Sprintf("/dev/dri/renderD%d", m)
		}
		var mem int64
		for _, b := range s.FS.Glob(kfd+"/"+n+"/mem_banks", "") {
			if mp, err := readProps(s, kfd+"/"+n+"/mem_banks/"+b+"/properties"); err == nil {
				if sz := mp["size_in_bytes"]; sz > 0 && sz < 1<<50 {
					mem += int64(sz)
				}
			}
		}
		if mem > 0 {
			d.MemoryBytes = mem
		}
	}
	const kfdLinkXGMI = 11
	for n, i := range kfdToDev {
		dir := kfd + "/" + n + "/io_links"
		for _, l := range s.FS.Glob(dir, "") {
			lp, err := readProps(s, dir+"/"+l+"/properties")
			if err != nil || lp["type"] != kfdLinkXGMI {
				continue
			}
			j, ok := kfdToDev[strconv.FormatUint(lp["node_to"], 10)]
			if !ok {
				continue
			}
			gbps := float64(lp["max_bandwidth"]) / 1000 // MB/s
			if gbps <= 0 || gbps > 1e5 {
				gbps = infos[0].gbps
			}
			s.AddLink(Link{A: i, B: j, Kind: LinkXGMI, Lanes: 1, GBps: gbps})
		}
	}
	sortLinks(s.Host)
	return nil
}

// readProps parses a KFD properties file ("key value" per line).
func readProps(s *Scan, p string) (map[string]uint64, error) {
	text, err := s.FS.ReadAttr(p)
	if err != nil {
		return nil, err
	}
	m := map[string]uint64{}
	for _, line := range strings.Split(text, "\n") {
		f := strings.Fields(line)
		if len(f) != 2 {
			continue
		}
		if v, err := strconv.ParseUint(f[1], 10, 64); err == nil {
			m[f[0]] = v
		}
	}
	return m, nil
}

func sortLinks(h *Host) {
	ls := h.Links
	for i := 1; i < len(ls); i++ {
		for j := i; j > 0 && (ls[j].A < ls[j-1].A || ls[j].A == ls[j-1].A && ls[j].B < ls[j-1].B); j-- {
			ls[j], ls[j-1] = ls[j-1], ls[j]
		}
	}
}

// ---- Google TPU ----

type tpuPlugin struct{ basePlugin }

// TPUPlugin discovers Google TPU chips from PCI (vendor 0x1ae0, device id
// → generation), their device nodes (/dev/accel* for v4 and v5p,
// /dev/vfio/* for v5e and v6e), ICI links inferred from the chips' 2x2 or
// 2x4 layout on a host, and slice labels from the TPU VM environment
// (TPU_NAME, TPU_WORKER_ID, TPU_TOPOLOGY, TPU_ACCELERATOR_TYPE).
func TPUPlugin() Plugin {
	return &tpuPlugin{basePlugin{name: "tpu", maturity: Alpha, vendors: []uint16{VendorGoogle}}}
}

func (p *tpuPlugin) Discover(ctx context.Context, s *Scan) error {
	idx, infos, _ := addChips(s, VendorGoogle, KindTPU, "google", tpuChips, nil)
	if len(idx) == 0 {
		return nil
	}
	accel := s.FS.Glob("dev", "accel")
	vfio := s.FS.Glob("dev/vfio", "")
	var nodes []string
	for _, a := range accel {
		if a != "accel" { // dev/accel/ is the Gaudi-style directory
			nodes = append(nodes, "/dev/"+a)
		}
	}
	if len(nodes) == 0 {
		for _, v := range vfio {
			if v != "vfio" {
				nodes = append(nodes, "/dev/vfio/"+v)
			}
		}
	}
	if len(nodes) != len(idx) {
		s.Warn("dev", "%d TPU chips on PCI but %d device nodes (dev/accel*, dev/vfio/*)", len(idx), len(nodes))
	}
	for k, i := range idx {
		if k < len(nodes) {
			s.Host.Devices[i].DevNode = nodes[k]
		}
	}
	// ICI inside the host, chips numbered row-major on a 2-wide grid.
	if info := infos[0]; len(idx) == 4 || len(idx) == 8 {
		for k := range idx {
			x, y := k%2, k/2
			if x == 0 {
				s.AddLink(Link{A: idx[k], B: idx[k+1], Kind: LinkICI, Lanes: 1, GBps: info.gbps})
			}
			if y+1 < len(idx)/2 {
				s.AddLink(Link{A: idx[k], B: idx[k+2], Kind: LinkICI, Lanes: 1, GBps: info.gbps})
			}
		}
		sortLinks(s.Host)
		s.Warn("", "ICI links inside the host inferred from the chip count (%d)", len(idx))
	}
	if v := s.Getenv("TPU_NAME"); v != "" {
		s.SetLabel(LabelSlice, v)
	}
	if v := s.Getenv("TPU_WORKER_ID"); v != "" {
		s.SetLabel(LabelSliceWorker, v)
	}
	if v := s.Getenv("TPU_TOPOLOGY"); v != "" {
		if _, _, err := ParseSliceShape(v); err == nil {
			s.SetLabel(LabelSliceShape, v)
		} else {
			s.Warn("$TPU_TOPOLOGY", "%v", err)
		}
	}
	if v := s.Getenv("TPU_ACCELERATOR_TYPE"); v != "" {
		s.SetLabel(LabelAccelerator, v)
	}
	return nil
}

// ---- AWS Neuron ----

type neuronPlugin struct{ basePlugin }

// NeuronPlugin discovers AWS Inferentia and Trainium devices from PCI
// (vendor 0x1d0f; EFA and ENA functions of the same vendor are left to the
// NIC scan), their /dev/neuron* nodes, and NeuronLink neighbours from
// sys/class/neuron_device/neuron*/connected_devices.
func NeuronPlugin() Plugin {
	return &neuronPlugin{basePlugin{name: "neuron", maturity: Experimental, vendors: []uint16{VendorAmazon}}}
}

func (p *neuronPlugin) Discover(ctx context.Context, s *Scan) error {
	idx, infos, _ := addChips(s, VendorAmazon, KindNeuron, "aws", neuronChips, nil)
	if len(idx) == 0 {
		return nil
	}
	nodes := s.FS.Glob("dev", "neuron")
	if len(nodes) != len(idx) {
		s.Warn("dev", "%d Neuron devices on PCI but %d dev/neuron* nodes", len(idx), len(nodes))
	}
	for k, i := range idx {
		if k < len(nodes) {
			s.Host.Devices[i].DevNode = "/dev/" + nodes[k]
		}
	}
	const dir = "sys/class/neuron_device"
	found := false
	for k, i := range idx {
		p := fmt.Sprintf("%s/neuron%d/connected_devices", dir, k)
		text, err := s.FS.ReadAttr(p)
		if err != nil {
			continue
		}
		found = true
		for _, f := range strings.FieldsFunc(text, func(r rune) bool { return r == ',' || r == ' ' || r == '\n' }) {
			j, err := strconv.Atoi(f)
			if err != nil || j < 0 || j >= len(idx) {
				s.Warn(p, "bad neighbour %q; skipped", f)
				continue
			}
			if idx[j] != i {
				s.AddLink(Link{A: i, B: idx[j], Kind: LinkNeuronLink, Lanes: 1, GBps: infos[k].gbps})
			}
		}
	}
	if !found && len(idx) > 1 {
		s.Warn(dir, "no connected_devices: NeuronLink topology unknown")
	}
	sortLinks(s.Host)
	return nil
}

// ---- Intel Gaudi ----

type gaudiPlugin struct{ basePlugin }

// GaudiPlugin discovers Intel Gaudi accelerators from PCI (vendor 0x1da3),
// their /dev/accel/accel* nodes, and on a full 8-card board the scale-up
// all-to-all RoCE links, inferred from the model.
func GaudiPlugin() Plugin {
	return &gaudiPlugin{basePlugin{name: "gaudi", maturity: Experimental, vendors: []uint16{VendorHabana}}}
}

func (p *gaudiPlugin) Discover(ctx context.Context, s *Scan) error {
	idx, infos, fns := addChips(s, VendorHabana, KindHPU, "intel", gaudiChips, func(fn PCIFunction) bool {
		return fn.ClassCode() == ClassAccelerator
	})
	if len(idx) == 0 {
		return nil
	}
	// accel class entries point at their PCI function.
	byAddr := map[string]string{}
	for _, a := range s.FS.Glob("sys/class/accel", "accel") {
		if strings.Contains(a, "_") {
			continue // accel_controlD* control nodes
		}
		if fn, ok := s.deviceFunction("sys/class/accel/" + a + "/device"); ok {
			byAddr[fn.Address] = a
		}
	}
	for k, i := range idx {
		if a, ok := byAddr[fns[k].Address]; ok && s.FS.Exists("dev/accel/"+a) {
			s.Host.Devices[i].DevNode = "/dev/accel/" + a
		}
	}
	if len(byAddr) == 0 {
		s.Warn("sys/class/accel", "no accel class devices (habanalabs not loaded?)")
	}
	if info := infos[0]; len(idx) == info.board && info.lanes > 0 {
		allToAll(s, idx, Link{Kind: LinkRoCE, Lanes: info.lanes, GBps: info.gbps})
		s.Warn("", "scale-up RoCE all-to-all inferred from %d %s", len(idx), info.model)
	}
	return nil
}

// ---- Intel GPUs ----

type intelGPUPlugin struct{ basePlugin }

// IntelGPUPlugin discovers Intel Data Center GPU Max and Flex cards from
// PCI (vendor 0x8086, display classes, known device ids only: integrated
// graphics are left alone) and their /dev/dri/renderD* nodes. Xe Link is
// not read.
func IntelGPUPlugin() Plugin {
	return &intelGPUPlugin{basePlugin{name: "intel-gpu", maturity: Experimental, vendors: []uint16{VendorIntel}}}
}

func (p *intelGPUPlugin) Discover(ctx context.Context, s *Scan) error {
	idx, _, fns := addChips(s, VendorIntel, KindGPU, "intel", intelGPUChips, nil)
	for k, i := range idx {
		// drm/renderD* under the PCI function names the render node.
		for _, n := range s.FS.Glob(fns[k].Path+"/drm", "renderD") {
			if s.FS.Exists("dev/dri/" + n) {
				s.Host.Devices[i].DevNode = "/dev/dri/" + n
			}
		}
	}
	if len(idx) > 1 {
		s.Warn("", "Xe Link between Intel GPUs is not read; devices talk over PCIe")
	}
	return nil
}
