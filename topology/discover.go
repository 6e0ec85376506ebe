package topology

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math"
	"os"
	"regexp"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"time"
)

// DiscoverConfig configures Discover. The zero value discovers the live
// machine with the default plugins.
type DiscoverConfig struct {
	// Root is the directory that holds sys/, dev/, proc/ and etc/ (""
	// or "/" for the live system). A directory that is itself a sysfs
	// (it holds bus/ or devices/) is accepted too; dev/ is then looked for
	// beside it.
	Root string
	// HostID names the discovered host; "" uses the host name.
	HostID string
	// Plugins replaces DefaultPlugins when non-nil.
	Plugins []Plugin
	// Env is the environment plugins and labels see (TPU_WORKER_ID,
	// TENSORLANE_LABELS, ...); nil means the process environment when Root
	// is the live system and an empty one otherwise.
	Env func(string) string
	// Labels are added to the host last, overriding discovered ones.
	Labels map[string]string
	// LabelFiles are read for labels, one key=value (or key="value", the
	// Kubernetes downward-API format) per line; nil means
	// etc/tensorlane/labels and etc/podinfo/labels under Root.
	LabelFiles []string
	// Logger receives warnings at Warn level; nil means slog.Default()
	// with warnings not logged (they are returned in the Discovery).
	Logger *slog.Logger
}

// Discovery is what Discover found.
type Discovery struct {
	Host *Host `json:"host"`
	// Warnings name each file discovery could not use and what it did.
	Warnings []Warning `json:"warnings,omitempty"`
	// Plugins reports each plugin run, in order.
	Plugins []PluginRun `json:"plugins"`
	// PCIFunctions is the number of PCI functions scanned.
	PCIFunctions int `json:"pci_functions"`
	// Elapsed is how long discovery took.
	Elapsed time.Duration `json:"elapsed_ns"`
}

// PluginRun is one plugin's part in a discovery.
type PluginRun struct {
	Name     string   `json:"name"`
	Maturity Maturity `json:"maturity"`
	Devices  int      `json:"devices"`
	Err      string   `json:"error,omitempty"`
}

// Cluster returns a one-host cluster of the discovered host.
func (d *Discovery) Cluster() *Cluster {
	return &Cluster{Name: d.Host.ID, Hosts: []*Host{d.Host}}
}

// ErrNoRoot is returned when the configured root does not exist.
var ErrNoRoot = errors.New("topology: discovery root not found")

// Env variables and label sources.
const (
	// EnvLabels holds extra host labels: "k=v,k2=v2".
	EnvLabels = "TENSORLANE_LABELS"
)

// Discover builds the model of one host from Linux sysfs: NUMA nodes, the
// PCIe tree, NICs and RDMA devices, then each plugin's devices and links,
// then labels. Unreadable or malformed entries become Warnings; Discover
// fails only when ctx is done or the root does not exist. It reads files
// only and starts no goroutines.
func Discover(ctx context.Context, cfg DiscoverConfig) (*Discovery, error) {
	start := time.Now()
	root, err := resolveRoot(cfg.Root)
	if err != nil {
		return nil, err
	}
	live := root.Root() == "/"
	env := cfg.Env
	if env == nil {
		if live {
			env = os.Getenv
		} else {
			env = func(string) string { return "" }
		}
	}
	s := &Scan{FS: root, Host: &Host{Labels: map[string]string{}}, env: env, claimed: map[string]string{}}
	s.Host.ID = cfg.HostID
	if s.Host.ID == "" {
		s.Host.ID = hostName(root, live)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	scanNUMA(s)
	scanPCI(ctx, s)
	scanNICs(s)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	plugins := cfg.Plugins
	if plugins == nil {
		plugins = DefaultPlugins()
	}
	d := &Discovery{Host: s.Host, PCIFunctions: len(s.PCI)}
	for _, p := range plugins {
		if err := ctx.Err(); err != nil {
			return nil, err
		}
		run := runPlugin(ctx, s, p)
		d.Plugins = append(d.Plugins, run)
	}
	s.plugin = ""
	applyLabels(s, cfg)
	pruneSwitches(s.Host)
	if len(s.Host.Devices) > 0 {
		if _, ok := s.Host.Labels[LabelAccelerator]; !ok {
			s.Host.Labels[LabelAccelerator] = acceleratorLabel(s.Host.Devices)
		}
	}
	if len(s.Host.Labels) == 0 {
		s.Host.Labels = nil
	}
	if s.Host.Devices == nil {
		s.Host.Devices = []Device{}
	}
	if err := (&Cluster{Hosts: []*Host{s.Host}}).Validate(); err != nil {
		// Should not happen; say so rather than hand out a broken model.
		s.Warn("", "model failed validation: %v", err)
	}
	d.Warnings = s.warnings
	d.Elapsed = time.Since(start)
	if cfg.Logger != nil {
		for _, w := range d.Warnings {
			cfg.Logger.Warn("topology discovery", "plugin", w.Plugin, "path", w.Path, "msg", w.Msg)
		}
	}
	return d, nil
}

func runPlugin(ctx context.Context, s *Scan, p Plugin) (run PluginRun) {
	name := p.Name()
	run = PluginRun{Name: name, Maturity: p.Maturity()}
	s.plugin = name
	before := len(s.Host.Devices)
	defer func() {
		if r := recover(); r != nil {
			run.Err = fmt.Sprintf("panic: %v", r)
			s.Warn("", "plugin panicked (a bug in the plugin): %v\n%s", r, debug.Stack())
		}
		run.Devices = len(s.Host.Devices) - before
	}()
	if err := p.Discover(ctx, s); err != nil {
		run.Err = err.Error()
		s.Warn("", "%v", err)
	}
	return run
}

func resolveRoot(dir string) (FS, error) {
	f := NewFS(dir)
	if f.Root() == "/" {
		return f, nil
	}
	fi, err := os.Stat(f.Root())
	if err != nil {
		return FS{}, fmt.Errorf("%w: %w", ErrNoRoot, err)
	}
	if !fi.IsDir() {
		return FS{}, fmt.Errorf("%w: %s is not a directory", ErrNoRoot, dir)
	}
	if !f.Exists("sys") && (f.Exists("bus") || f.Exists("devices") || f.Exists("class")) {
		// A sysfs itself: use a synthetic root in which sys is this dir.
		return FS{root: f.Root(), sysfsOnly: true}, nil
	}
	return f, nil
}

func hostName(f FS, live bool) string {
	if live {
		if h, err := os.Hostname(); err == nil && h != "" {
			return h
		}
	}
	for _, p := range []string{"proc/sys/kernel/hostname", "etc/hostname"} {
		if h, err := f.ReadAttr(p); err == nil && h != "" && len(h) < 256 && !strings.ContainsAny(h, " \t\n/") {
			return h
		}
	}
	return "localhost"
}

// scanNUMA reads sys/devices/system/node.
func scanNUMA(s *Scan) {
	const dir = "sys/devices/system/node"
	nodes := s.FS.Glob(dir, "node")
	for _, n := range nodes {
		id, err := strconv.Atoi(strings.TrimPrefix(n, "node"))
		if err != nil || id < 0 || id >= maxNUMA {
			continue // "node" files like has_cpu are not nodes
		}
		p := dir + "/" + n
		node := NUMANode{ID: id}
		if cpus, err := s.FS.ReadAttr(p + "/cpulist"); err != nil {
			s.Warn(p+"/cpulist", "unreadable: %v", errText(err))
		} else if _, err := ParseCPUList(cpus); err != nil {
			s.Warn(p+"/cpulist", "%v", err)
		} else {
			node.CPUs = cpus
		}
		if dist, err := s.FS.ReadAttr(p + "/distance"); err == nil {
			for _, f := range strings.Fields(dist) {
				v, err := strconv.Atoi(f)
				if err != nil || v < 0 || v > 255 {
					s.Warn(p+"/distance", "bad distance %q; distances dropped", f)
					node.Distances = nil
					break
				}
				node.Distances = append(node.Distances, v)
			}
		} else {
			s.Warn(p+"/distance", "unreadable: %v", errText(err))
		}
		if mem, err := s.FS.ReadAttr(p + "/meminfo"); err == nil {
			node.MemoryBytes = parseNodeMemTotal(mem)
		}
		s.Host.NUMA = append(s.Host.NUMA, node)
	}
	sort.Slice(s.Host.NUMA, func(i, j int) bool { return s.Host.NUMA[i].ID < s.Host.NUMA[j].ID })
	if len(s.Host.NUMA) == 0 {
		cpus, err := s.FS.ReadAttr("sys/devices/system/cpu/online")
		if err != nil {
			s.Warn(dir, "no NUMA nodes and no sys/devices/system/cpu/online; assuming one node")
		} else if _, err := ParseCPUList(cpus); err != nil {
			s.Warn("sys/devices/system/cpu/online", "%v", err)
			cpus = ""
		}
		s.Host.NUMA = []NUMANode{{ID: 0, CPUs: cpus, Distances: []int{10}}}
	}
}

func parseNodeMemTotal(meminfo string) int64 {
	for _, line := range strings.Split(meminfo, "\n") {
		f := strings.Fields(line)
		// "Node 0 MemTotal:       131072000 kB"
		if len(f) >= 4 && f[2] == "MemTotal:" {
			v, err := strconv.ParseInt(f[3], 10, 64)
			if err != nil || v < 0 || v > math.MaxInt64/1024 {
				return 0
			}
			return v * 1024
		}
	}
	return 0
}

var (
	pciAddrRE    = regexp.MustCompile(`^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$`)
	hostBridgeRE = regexp.MustCompile(`^pci[0-9a-f]{4,8}:[0-9a-f]{2}$`)
)

// scanPCI reads sys/bus/pci/devices.
func scanPCI(ctx context.Context, s *Scan) {
	const dir = "sys/bus/pci/devices"
	names, err := s.FS.List(dir)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.Warn(dir, "unreadable: %v", errText(err))
		}
		return
	}
	const maxFunctions = 1 << 14
	if len(names) > maxFunctions {
		s.Warn(dir, "%d entries; only the first %d scanned", len(names), maxFunctions)
		names = names[:maxFunctions]
	}
	for _, n := range names {
		if ctx.Err() != nil {
			return
		}
		p := dir + "/" + n
		addr := strings.ToLower(n)
		if !pciAddrRE.MatchString(addr) {
			s.Warn(p, "not a PCI address; skipped")
			continue
		}
		real, err := s.Resolve(p)
		if err != nil {
			s.Warn(p, "cannot resolve: %v", errText(err))
			continue
		}
		fn := PCIFunction{Address: addr, Path: real, NUMA: -1}
		ok := true
		for _, a := range []struct {
			name string
			dst  *uint16
		}{{"vendor", &fn.Vendor}, {"device", &fn.Device}, {"subsystem_vendor", &fn.SubVendor}, {"subsystem_device", &fn.SubDevice}} {
			v, err := s.FS.ReadHex(p + "/" + a.name)
			if err != nil || v > 0xffff {
				if a.name == "vendor" || a.name == "device" {
					s.Warn(p+"/"+a.name, "unreadable or not a 16-bit hex id (%v); function skipped", errText(err))
					ok = false
					break
				}
				continue
			}
			*a.dst = uint16(v)
		}
		if !ok {
			continue
		}
		if v, err := s.FS.ReadHex(p + "/class"); err != nil || v > 0xffffff {
			s.Warn(p+"/class", "unreadable or not a 24-bit class (%v); class unknown", errText(err))
		} else {
			fn.Class = uint32(v)
		}
		if v, err := s.FS.ReadInt(p + "/numa_node"); err == nil {
			if v >= -1 && v < maxNUMA {
				fn.NUMA = int(v)
			} else {
				s.Warn(p+"/numa_node", "absurd value %d; no NUMA affinity assumed", v)
			}
		} else if !errors.Is(err, fs.ErrNotExist) {
			s.Warn(p+"/numa_node", "unreadable: %v", errText(err))
		}
		if c, err := s.FS.ReadAttr(p + "/local_cpulist"); err == nil {
			if _, err := ParseCPUList(c); err == nil {
				fn.LocalCPUs = c
			}
		}
		if t, err := s.FS.ReadLink(p + "/driver"); err == nil {
			fn.Driver = lastElem(t)
		}
		parts := strings.Split(real, "/")
		for i := len(parts) - 2; i >= 0; i-- {
			c := strings.ToLower(parts[i])
			if pciAddrRE.MatchString(c) {
				fn.Bridges = append(fn.Bridges, c)
				continue
			}
			if hostBridgeRE.MatchString(c) {
				fn.HostBridge = c
			}
			break
		}
		if fn.HostBridge == "" && len(fn.Bridges) == 0 {
			// e.g. a Hyper-V passthrough bus: give it a synthetic complex.
			fn.HostBridge = "pci" + addr[:strings.LastIndex(addr, ":")]
		}
		s.PCI = append(s.PCI, fn)
	}
	sort.Slice(s.PCI, func(i, j int) bool { return s.PCI[i].Address < s.PCI[j].Address })
	// Negotiated link: the lesser of the function's and its parent's.
	for i := range s.PCI {
		fn := &s.PCI[i]
		p := dir + "/" + fn.Address
		l, ok := readLink(s, p)
		if !ok {
			continue
		}
		if len(fn.Bridges) > 0 {
			if pl, ok := readLink(s, dir+"/"+fn.Bridges[0]); ok {
				l.GTps = math.Min(l.GTps, pl.GTps)
				l.Width = min(l.Width, pl.Width)
			}
		}
		fn.Link = &l
	}
}

// readLink reads current_link_speed ("16.0 GT/s PCIe") and
// current_link_width of one function.
func readLink(s *Scan, p string) (PCIeLink, bool) {
	sp, err := s.FS.ReadAttr(p + "/current_link_speed")
	if err != nil {
		return PCIeLink{}, false
	}
	f := strings.Fields(sp)
	if len(f) == 0 {
		return PCIeLink{}, false
	}
	gt, err := strconv.ParseFloat(f[0], 64)
	if err != nil || gt <= 0 || gt > 1024 || math.IsNaN(gt) {
		if sp != "Unknown" && !strings.HasPrefix(sp, "Unknown") {
			s.Warn(p+"/current_link_speed", "cannot parse %q", sp)
		}
		return PCIeLink{}, false
	}
	w, err := s.FS.ReadInt(p + "/current_link_width")
	if err != nil || w <= 0 || w > 32 {
		return PCIeLink{}, false
	}
	return PCIeLink{GTps: gt, Width: int(w)}, true
}

// scanNICs reads sys/class/net and sys/class/infiniband.
func scanNICs(s *Scan) {
	const netDir = "sys/class/net"
	byAddr := map[string][]int{} // PCI address -> NIC indices
	names, _ := s.FS.List(netDir)
	for _, n := range names {
		p := netDir + "/" + n
		if !s.FS.Exists(p + "/device") {
			continue // lo, bridges, veth: no hardware behind them
		}
		fn, ok := s.deviceFunction(p + "/device")
		nic := NIC{Name: n, NUMA: -1}
		if v, err := s.FS.ReadInt(p + "/speed"); err == nil && v > 0 && v < 10_000_000 {
			nic.SpeedGbps = float64(v) / 1000
		}
		if st, err := s.FS.ReadAttr(p + "/operstate"); err == nil && len(st) < 32 {
			nic.State = st
		}
		if ok {
			nic.BusID, nic.Driver = fn.Address, fn.Driver
			nic.NUMA = s.numaOf(fn.NUMA)
			nic.PCIeSwitch = s.attach(fn)
			s.Claim(fn.Address)
			byAddr[fn.Address] = append(byAddr[fn.Address], len(s.Host.NICs))
		} else {
			nic.NUMA = s.numaOf(-1)
			if t, err := s.FS.ReadLink(p + "/device/driver"); err == nil {
				nic.Driver = lastElem(t)
			}
		}
		s.Host.NICs = append(s.Host.NICs, nic)
	}
	const ibDir = "sys/class/infiniband"
	ibs, err := s.FS.List(ibDir)
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.Warn(ibDir, "unreadable: %v", errText(err))
	}
	for _, ib := range ibs {
		p := ibDir + "/" + ib
		fn, ok := s.deviceFunction(p + "/device")
		var port string
		ports := s.FS.Glob(p+"/ports", "")
		if len(ports) > 0 {
			port = p + "/ports/" + ports[0]
		}
		var rate float64
		var state, layer string
		if port != "" {
			if r, err := s.FS.ReadAttr(port + "/rate"); err == nil {
				// "400 Gb/sec (4X NDR)"
				if f := strings.Fields(r); len(f) > 0 {
					if v, err := strconv.ParseFloat(f[0], 64); err == nil && v >= 0 && v < 100000 {
						rate = v
					}
				}
			}
			if st, err := s.FS.ReadAttr(port + "/state"); err == nil {
				// "4: ACTIVE"
				if _, after, found := strings.Cut(st, ":"); found {
					st = strings.TrimSpace(after)
				}
				if len(st) < 32 {
					state = st
				}
			}
			if ll, err := s.FS.ReadAttr(port + "/link_layer"); err == nil && len(ll) < 32 {
				layer = ll
			}
		} else {
			s.Warn(p+"/ports", "no ports; rate and state unknown")
		}
		fw, _ := s.FS.ReadAttr(p + "/fw_ver")
		if len(fw) > 64 {
			fw = ""
		}
		// Prefer the netdev of the same PCI function.
		var idx = -1
		if ok {
			if l := byAddr[fn.Address]; len(l) > 0 {
				idx = l[0]
			}
		}
		if idx < 0 {
			nic := NIC{Name: ib, NUMA: s.numaOf(-1)}
			if ok {
				nic.BusID, nic.Driver, nic.NUMA = fn.Address, fn.Driver, s.numaOf(fn.NUMA)
				nic.PCIeSwitch = s.attach(fn)
				s.Claim(fn.Address)
			}
			idx = len(s.Host.NICs)
			s.Host.NICs = append(s.Host.NICs, nic)
			if ok {
				byAddr[fn.Address] = append(byAddr[fn.Address], idx)
			}
		}
		n := &s.Host.NICs[idx]
		n.RDMADevice = ib
		n.LinkLayer = layer
		if state != "" {
			n.State = state
		}
		if n.SpeedGbps == 0 {
			n.SpeedGbps = rate
		}
		n.Firmware = fw
	}
	sort.SliceStable(s.Host.NICs, func(i, j int) bool {
		a, b := s.Host.NICs[i], s.Host.NICs[j]
		if a.BusID != b.BusID {
			return a.BusID < b.BusID
		}
		return naturalLess(a.Name, b.Name)
	})
}

// deviceFunction follows a "device" link to the nearest PCI function.
func (s *Scan) deviceFunction(link string) (PCIFunction, bool) {
	real, err := s.Resolve(link)
	if err != nil {
		if !errors.Is(err, fs.ErrNotExist) {
			s.Warn(link, "cannot resolve: %v", errText(err))
		}
		return PCIFunction{}, false
	}
	parts := strings.Split(real, "/")
	for i := len(parts) - 1; i >= 0; i-- {
		if pciAddrRE.MatchString(parts[i]) {
			return s.Function(parts[i])
		}
	}
	return PCIFunction{}, false
}

func applyLabels(s *Scan, cfg DiscoverConfig) {
	files := cfg.LabelFiles
	if files == nil {
		files = []string{"etc/tensorlane/labels", "etc/podinfo/labels"}
	}
	for _, f := range files {
		var text string
		var err error
		if cfg.LabelFiles != nil {
			text, err = readAttrFile(f)
		} else {
			text, err = s.FS.ReadAttr(f)
		}
		if err != nil {
			if !errors.Is(err, fs.ErrNotExist) {
				s.Warn(f, "unreadable: %v", errText(err))
			}
			continue
		}
		for i, line := range strings.Split(text, "\n") {
			line = strings.TrimSpace(line)
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			k, v, ok := strings.Cut(line, "=")
			k, v = strings.TrimSpace(k), strings.Trim(strings.TrimSpace(v), `"`)
			if !ok || !validLabel(k, v) {
				s.Warn(f, "line %d: not a key=value label; skipped", i+1)
				continue
			}
			s.Host.Labels[k] = v
		}
	}
	if env := s.Getenv(EnvLabels); env != "" {
		for _, kv := range strings.Split(env, ",") {
			k, v, ok := strings.Cut(kv, "=")
			k, v = strings.TrimSpace(k), strings.TrimSpace(v)
			if !ok || !validLabel(k, v) {
				s.Warn("$"+EnvLabels, "%q is not a key=value label; skipped", kv)
				continue
			}
			s.Host.Labels[k] = v
		}
	}
	for k, v := range cfg.Labels {
		s.Host.Labels[k] = v
	}
}

func validLabel(k, v string) bool {
	return k != "" && len(k) <= 253 && len(v) <= 253 && !strings.ContainsAny(k, " \t\"=") && !strings.ContainsAny(v, "\t\n")
}

// pruneSwitches keeps the switches that some device or NIC sits under, and
// their ancestors, in the order they were added.
func pruneSwitches(h *Host) {
	byID := map[string]PCIeSwitch{}
	for _, s := range h.Switches {
		byID[s.ID] = s
	}
	keep := map[string]bool{}
	mark := func(id string) {
		for n := 0; id != "" && !keep[id] && n < 64; n++ {
			keep[id] = true
			id = byID[id].Parent
		}
	}
	for _, d := range h.Devices {
		mark(d.PCIeSwitch)
	}
	for _, n := range h.NICs {
		mark(n.PCIeSwitch)
	}
	out := h.Switches[:0]
	for _, s := range h.Switches {
		if keep[s.ID] {
			out = append(out, s)
		}
	}
	sort.SliceStable(out, func(i, j int) bool { return naturalLess(out[i].ID, out[j].ID) })
	h.Switches = out
	if len(h.Switches) == 0 {
		h.Switches = nil
	}
}

func acceleratorLabel(ds []Device) string {
	counts := map[string]int{}
	best := ""
	for _, d := range ds {
		counts[d.Model]++
		if counts[d.Model] > counts[best] {
			best = d.Model
		}
	}
	return best
}

func lastElem(p string) string {
	p = strings.TrimRight(p, "/")
	if i := strings.LastIndex(p, "/"); i >= 0 {
		return p[i+1:]
	}
	return p
}

// errText shortens os errors to their cause ("no such file or directory").
func errText(err error) string {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err.Error()
	}
	if err == nil {
		return "bad value"
	}
	return err.Error()
}
