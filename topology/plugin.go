package topology

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"sync"
)

// Maturity is how far a device plugin has been proven. Each level adds
// requirements (docs/accelerators.md has the full table):
//
//   - Experimental: implements Plugin; the conformance suite's basic checks
//     pass (no panics, empty tree, bad input, idempotence, cancellation).
//   - Alpha: the plugin has at least one realistic fixture tree whose
//     discovery matches a golden model.
//   - Beta: fixtures for every supported generation, and the plugin's
//     devices round-trip through the topology file and fill NUMA, PCIe
//     switch and memory for every device.
//   - Stable: Beta, plus the conformance suite run on real hardware in the
//     vendor's CI tier, recorded in the plugin's declaration.
type Maturity int

const (
	Experimental Maturity = iota
	Alpha
	Beta
	Stable
)

var maturityNames = [...]string{"experimental", "alpha", "beta", "stable"}

func (m Maturity) String() string {
	if m < 0 || int(m) >= len(maturityNames) {
		return fmt.Sprintf("Maturity(%d)", int(m))
	}
	return maturityNames[m]
}

// MarshalText writes the level's name, so JSON says "beta" as the CLI's
// tables do; a level below Experimental (nothing verified) is "none".
func (m Maturity) MarshalText() ([]byte, error) {
	if m < 0 {
		return []byte("none"), nil
	}
	return []byte(m.String()), nil
}

// UnmarshalJSON reads a level's name, or the number older output wrote.
func (m *Maturity) UnmarshalJSON(p []byte) error {
	var n int
	if err := json.Unmarshal(p, &n); err == nil {
		*m = Maturity(n)
		return nil
	}
	var s string
	if err := json.Unmarshal(p, &s); err != nil {
		return fmt.Errorf("topology: maturity %s: want a level name", p)
	}
	if s == "none" {
		*m = -1
		return nil
	}
	v, err := ParseMaturity(s)
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// ParseMaturity parses a level name as printed by String.
func ParseMaturity(s string) (Maturity, error) {
	for i, n := range maturityNames {
		if strings.EqualFold(s, n) {
			return Maturity(i), nil
		}
	}
	return 0, fmt.Errorf("topology: unknown maturity %q", s)
}

// Plugin discovers one vendor's devices. Discovery runs the core scan
// (NUMA nodes, PCI functions, PCIe tree, NICs, RDMA devices) and then each
// plugin in turn with the same Scan; a plugin claims the PCI functions that
// are its devices, adds them with Scan.AddDevice, and adds device links and
// labels. A plugin must not panic on any input and should report what it
// could not read with Scan.Warn rather than fail: an error it returns is
// recorded as a warning too, and discovery goes on with the next plugin.
//
// Plugins are run by the conformance suite in topology/topocheck (in a
// vendor's tests through topology/topotest.Run).
type Plugin interface {
	// Name is short, lower case and stable ("nvidia", "amd").
	Name() string
	// Maturity is the level the plugin's authors declare; the conformance
	// suite reports the level it could verify.
	Maturity() Maturity
	// Discover adds the plugin's devices to the scan.
	Discover(ctx context.Context, s *Scan) error
}

// Optional capability: a plugin that knows its PCI vendor IDs lets the
// conformance suite check that it claims nothing else.
type VendorIDer interface {
	VendorIDs() []uint16
}

var (
	registryMu sync.Mutex
	registry   []Plugin
)

// Register adds a plugin to those DefaultPlugins returns (for vendors whose
// plugin lives in their own module: call it from an init function). A
// plugin with the name of one already registered replaces it.
func Register(p Plugin) {
	registryMu.Lock()
	defer registryMu.Unlock()
	for i, q := range registry {
		if q.Name() == p.Name() {
			registry[i] = p
			return
		}
	}
	registry = append(registry, p)
}

// BuiltinPlugins returns new instances of the plugins that ship with
// tensorlane, in discovery order.
func BuiltinPlugins() []Plugin {
	return []Plugin{NVIDIAPlugin(), AMDPlugin(), TPUPlugin(), NeuronPlugin(), GaudiPlugin(), IntelGPUPlugin()}
}

// DefaultPlugins returns the built-in plugins followed by registered ones.
func DefaultPlugins() []Plugin {
	ps := BuiltinPlugins()
	registryMu.Lock()
	defer registryMu.Unlock()
	for _, r := range registry {
		replaced := false
		for i, p := range ps {
			if p.Name() == r.Name() {
				ps[i], replaced = r, true
			}
		}
		if !replaced {
			ps = append(ps, r)
		}
	}
	return ps
}

// PCIFunction is one entry of /sys/bus/pci/devices as the core scan saw it.
type PCIFunction struct {
	// Address is the PCI address, "0000:18:00.0".
	Address string
	// Path is the real sysfs path relative to the root
	// ("sys/devices/pci0000:00/0000:00:01.0/0000:01:00.0").
	Path string
	// Vendor, Device, SubVendor and SubDevice are the PCI IDs; Class the
	// 24-bit class code (0x030200 for a 3D controller).
	Vendor, Device, SubVendor, SubDevice uint16
	Class                                uint32
	// NUMA is numa_node (-1 when the kernel gives none); LocalCPUs the
	// local_cpulist.
	NUMA      int
	LocalCPUs string
	// Driver is the bound kernel driver, "" when none.
	Driver string
	// Link is the negotiated link (the lesser of the function's and its
	// parent's current speed and width); nil when sysfs has none.
	Link *PCIeLink
	// Bridges are the PCI addresses of the bridges above the function,
	// nearest first; HostBridge the root complex ("pci0000:00").
	Bridges    []string
	HostBridge string
}

// ClassCode returns the class and subclass (0x0302).
func (p PCIFunction) ClassCode() uint16 { return uint16(p.Class >> 8) }

// PCI class codes the core scan and plugins look at.
const (
	ClassVGA         = 0x0300
	ClassDisplay3D   = 0x0302
	ClassDisplayOth  = 0x0380
	ClassEthernet    = 0x0200
	ClassInfiniBand  = 0x0207
	ClassNetworkOth  = 0x0280
	ClassBridgePCI   = 0x0604
	ClassBridgeOther = 0x0680
	ClassAccelerator = 0x1200
)

// PCI vendor IDs.
const (
	VendorNVIDIA   = 0x10de
	VendorAMD      = 0x1002
	VendorIntel    = 0x8086
	VendorHabana   = 0x1da3
	VendorGoogle   = 0x1ae0
	VendorAmazon   = 0x1d0f
	VendorMellanox = 0x15b3
	VendorBroadcom = 0x14e4
	VendorLSI      = 0x1000 // Broadcom / LSI PCIe switches
	VendorPLX      = 0x10b5 // Broadcom / PLX PCIe switches
	VendorVirtIO   = 0x1af4
)

// Warning is a problem discovery met and worked around: the file it could
// not read or parse and what it did instead.
type Warning struct {
	// Plugin is the plugin that reported it, "" for the core scan.
	Plugin string `json:"plugin,omitempty"`
	// Path is the file or directory concerned, relative to the root.
	Path string `json:"path,omitempty"`
	Msg  string `json:"msg"`
}

func (w Warning) String() string {
	var b strings.Builder
	if w.Plugin != "" {
		b.WriteString(w.Plugin + ": ")
	}
	if w.Path != "" {
		b.WriteString(w.Path + ": ")
	}
	b.WriteString(w.Msg)
	return b.String()
}

// Scan is the state of one discovery: what the core scan found and the host
// being built. Plugins read it and add to it; it is not safe for use by
// several goroutines.
type Scan struct {
	// FS reads the system tree.
	FS FS
	// Host is the host being built. Plugins may read it; they add devices
	// with AddDevice and links with AddLink.
	Host *Host
	// PCI lists every PCI function in address order.
	PCI []PCIFunction

	env      func(string) string
	claimed  map[string]string // PCI address -> plugin
	plugin   string
	warnings []Warning
	switches map[string]bool
	added    map[string]int // plugin -> devices
	pciIdx   map[string]int
	real     map[string]bool // Resolve cache
}

// Resolve is FS.Resolve, caching what it learns for the rest of the scan.
func (s *Scan) Resolve(rel string) (string, error) {
	if s.real == nil {
		s.real = map[string]bool{}
	}
	return s.FS.resolve(rel, s.real)
}

// Getenv returns the environment variable as discovery was configured to
// see it (DiscoverConfig.Env).
func (s *Scan) Getenv(key string) string {
	if s.env == nil {
		return ""
	}
	return s.env(key)
}

// Warn records a warning attributed to the running plugin.
func (s *Scan) Warn(path, format string, args ...any) {
	s.warnings = append(s.warnings, Warning{Plugin: s.plugin, Path: path, Msg: fmt.Sprintf(format, args...)})
}

// Warnings returns the warnings so far.
func (s *Scan) Warnings() []Warning { return append([]Warning(nil), s.warnings...) }

// Functions returns the PCI functions of the vendor, in address order.
func (s *Scan) Functions(vendor uint16) []PCIFunction {
	var out []PCIFunction
	for _, f := range s.PCI {
		if f.Vendor == vendor {
			out = append(out, f)
		}
	}
	return out
}

// Function returns the PCI function with the given address.
func (s *Scan) Function(addr string) (PCIFunction, bool) {
	if len(s.pciIdx) != len(s.PCI) {
		s.pciIdx = make(map[string]int, len(s.PCI))
		for i, f := range s.PCI {
			s.pciIdx[f.Address] = i
		}
	}
	i, ok := s.pciIdx[addr]
	if !ok || i >= len(s.PCI) || s.PCI[i].Address != addr {
		return PCIFunction{}, false
	}
	return s.PCI[i], true
}

// Claim marks the PCI function as the running plugin's device. It returns
// false (and changes nothing) when another plugin claimed it first.
func (s *Scan) Claim(addr string) bool {
	if owner, ok := s.claimed[addr]; ok && owner != s.plugin {
		return false
	}
	s.claimed[addr] = s.plugin
	return true
}

// AddDevice appends a device to the host and returns its index (devices are
// numbered in the order plugins add them). When fn is non-nil the function
// is claimed, the device's NUMA node comes from it, and its BusID, Driver,
// PCIe switch and link are filled from it where the plugin left them empty;
// AddDevice returns -1 when another plugin already claimed the function.
func (s *Scan) AddDevice(d Device, fn *PCIFunction) int {
	if fn != nil {
		if !s.Claim(fn.Address) {
			return -1
		}
		if d.BusID == "" {
			d.BusID = fn.Address
		}
		if d.Driver == "" {
			d.Driver = fn.Driver
		}
		if d.PCIe == nil && fn.Link != nil {
			l := *fn.Link
			d.PCIe = &l
		}
		if d.PCIeSwitch == "" {
			d.PCIeSwitch = s.attach(*fn)
		}
		d.NUMA = s.numaOf(fn.NUMA)
	}
	d.Index = len(s.Host.Devices)
	s.Host.Devices = append(s.Host.Devices, d)
	if s.added == nil {
		s.added = map[string]int{}
	}
	s.added[s.plugin]++
	return d.Index
}

// AddLink adds a device link between two device indices; links naming
// unknown devices or a device and itself are dropped with a warning.
func (s *Scan) AddLink(l Link) {
	if l.A == l.B {
		s.Warn("", "link of device %d to itself dropped", l.A)
		return
	}
	if _, ok := s.Host.Device(l.A); !ok {
		s.Warn("", "link %d-%d names an unknown device; dropped", l.A, l.B)
		return
	}
	if _, ok := s.Host.Device(l.B); !ok {
		s.Warn("", "link %d-%d names an unknown device; dropped", l.A, l.B)
		return
	}
	if l.A > l.B {
		l.A, l.B = l.B, l.A
	}
	for _, m := range s.Host.Links {
		if m.A == l.A && m.B == l.B && m.Kind == l.Kind {
			return
		}
	}
	s.Host.Links = append(s.Host.Links, l)
}

// SetLabel sets a host label unless the operator's configuration set it.
func (s *Scan) SetLabel(key, value string) {
	if s.Host.Labels == nil {
		s.Host.Labels = map[string]string{}
	}
	s.Host.Labels[key] = value
}

// numaOf maps a numa_node value onto the host's nodes: -1 on a host with a
// single node means that node.
func (s *Scan) numaOf(n int) int {
	if n < 0 && len(s.Host.NUMA) == 1 {
		return s.Host.NUMA[0].ID
	}
	return n
}

// attach makes sure the PCIe switches above fn are in the host model and
// returns the ID of the one fn sits under ("" when fn has no PCI parent
// known to sysfs). A PCIe switch shows in sysfs as an upstream port bridge
// with one downstream port bridge per slot; the two are one switch here,
// as in nvidia-smi, so that devices behind one switch are PIX. The root
// complex is the top of every chain: devices under different root ports of
// one complex are PHB, under different complexes of one NUMA node NODE.
func (s *Scan) attach(fn PCIFunction) string {
	if fn.HostBridge == "" {
		return ""
	}
	numa := s.numaOf(fn.NUMA)
	s.addSwitch(PCIeSwitch{ID: fn.HostBridge, NUMA: numa, HostBridge: true})
	parent := fn.HostBridge
	// top-down: root port, then switches (upstream port, downstream port)*
	for i := len(fn.Bridges) - 1; i >= 0; i-- {
		depth := len(fn.Bridges) - 1 - i
		if depth > 0 && depth%2 == 0 {
			continue // a downstream port: part of the switch above
		}
		addr := fn.Bridges[i]
		sw := PCIeSwitch{ID: addr, NUMA: numa, Parent: parent, BusID: addr}
		if bf, ok := s.Function(addr); ok {
			sw.NUMA = s.numaOf(bf.NUMA)
			if bf.NUMA < 0 {
				sw.NUMA = numa
			}
			sw.Vendor = vendorName(bf.Vendor)
		}
		s.addSwitch(sw)
		parent = addr
	}
	return parent
}

func (s *Scan) addSwitch(sw PCIeSwitch) {
	if s.switches == nil {
		s.switches = map[string]bool{}
	}
	if s.switches[sw.ID] {
		return
	}
	s.switches[sw.ID] = true
	s.Host.Switches = append(s.Host.Switches, sw)
}

func vendorName(v uint16) string {
	switch v {
	case VendorNVIDIA:
		return "nvidia"
	case VendorAMD:
		return "amd"
	case VendorIntel:
		return "intel"
	case VendorHabana:
		return "habana"
	case VendorGoogle:
		return "google"
	case VendorAmazon:
		return "aws"
	case VendorMellanox:
		return "mellanox"
	case VendorBroadcom, VendorLSI, VendorPLX:
		return "broadcom"
	case VendorVirtIO:
		return "virtio"
	case 0x11f8:
		return "microchip"
	}
	return fmt.Sprintf("%04x", v)
}
