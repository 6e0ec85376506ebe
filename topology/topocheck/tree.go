package topocheck

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

// Tree writes a fake Linux system tree (sys/, dev/, proc/, etc/) under a
// directory, with the symbolic links sysfs has, for discovery tests: a
// vendor builds the tree its plugin expects and runs the plugin on it.
// Errors are collected and returned by Err; methods do nothing after the
// first.
type Tree struct {
	Root string
	err  error
	dirs map[string]bool // directories known to exist
}

// NewTree returns a builder that writes under root (created if needed).
func NewTree(root string) *Tree {
	t := &Tree{Root: root, dirs: map[string]bool{}}
	t.setErr(os.MkdirAll(root, 0o755))
	return t
}

// Err returns the first error met while writing.
func (t *Tree) Err() error { return t.err }

func (t *Tree) setErr(err error) {
	if t.err == nil && err != nil {
		t.err = err
	}
}

func (t *Tree) abs(rel string) string { return filepath.Join(t.Root, filepath.FromSlash(rel)) }

// mkdir makes dir and its parents, remembering what exists.
func (t *Tree) mkdir(dir string) {
	if t.err != nil || t.dirs[dir] {
		return
	}
	t.setErr(os.MkdirAll(dir, 0o755))
	for d := dir; len(d) > len(t.Root); d = filepath.Dir(d) {
		t.dirs[d] = true
	}
}

// File writes a file (and its directories) with content plus a newline.
func (t *Tree) File(rel, content string) *Tree {
	if t.err != nil {
		return t
	}
	p := t.abs(rel)
	t.mkdir(filepath.Dir(p))
	if content != "" && !strings.HasSuffix(content, "\n") {
		content += "\n"
	}
	t.setErr(os.WriteFile(p, []byte(content), 0o644))
	return t
}

// Raw writes a file exactly as given.
func (t *Tree) Raw(rel string, content []byte) *Tree {
	if t.err != nil {
		return t
	}
	p := t.abs(rel)
	t.mkdir(filepath.Dir(p))
	t.setErr(os.WriteFile(p, content, 0o644))
	return t
}

// Dir makes a directory.
func (t *Tree) Dir(rel string) *Tree {
	t.mkdir(t.abs(rel))
	return t
}

// Link makes rel a symbolic link to target. A target that starts with "/"
// is written relative to rel's directory, so that the tree can be moved.
func (t *Tree) Link(rel, target string) *Tree {
	if t.err != nil {
		return t
	}
	p := t.abs(rel)
	t.mkdir(filepath.Dir(p))
	if strings.HasPrefix(target, "/") {
		r, err := filepath.Rel(filepath.Dir(p), t.abs(target[1:]))
		t.setErr(err)
		target = r
	}
	_ = os.Remove(p)
	t.setErr(os.Symlink(target, p))
	return t
}

// NUMANode writes sys/devices/system/node/node<id> with its cpulist,
// distance row and memory.
func (t *Tree) NUMANode(id int, cpus string, distances []int, memKB int64) *Tree {
	d := fmt.Sprintf("sys/devices/system/node/node%d", id)
	var row []string
	for _, v := range distances {
		row = append(row, fmt.Sprint(v))
	}
	t.File(d+"/cpulist", cpus)
	t.File(d+"/distance", strings.Join(row, " "))
	t.File(d+"/meminfo", fmt.Sprintf("Node %d MemTotal:       %d kB\nNode %d MemFree:        %d kB", id, memKB, id, memKB/2))
	return t
}

// PCI describes one PCI function for Tree.PCI.
type PCI struct {
	Vendor, Device       uint16
	SubVendor, SubDevice uint16
	Class                uint32
	NUMA                 int // written as numa_node; use -1 for none
	Driver               string
	// LinkGTps and LinkWidth, when set, become current_link_speed and
	// current_link_width.
	LinkGTps  float64
	LinkWidth int
	LocalCPUs string
}

// HostBridge returns the sysfs directory of a PCI root complex
// ("sys/devices/pci0000:00") and creates it.
func (t *Tree) HostBridge(domainBus string) string {
	d := "sys/devices/pci" + domainBus
	t.Dir(d)
	return d
}

// PCI writes the function addr under the parent directory (a host bridge
// or another function's directory) with its attributes, links it from
// sys/bus/pci/devices and to its driver, and returns its directory.
func (t *Tree) PCI(parent, addr string, f PCI) string {
	d := parent + "/" + addr
	t.File(d+"/vendor", fmt.Sprintf("0x%04x", f.Vendor))
	t.File(d+"/device", fmt.Sprintf("0x%04x", f.Device))
	if f.SubVendor != 0 || f.SubDevice != 0 {
		t.File(d+"/subsystem_vendor", fmt.Sprintf("0x%04x", f.SubVendor))
		t.File(d+"/subsystem_device", fmt.Sprintf("0x%04x", f.SubDevice))
	}
	t.File(d+"/class", fmt.Sprintf("0x%06x", f.Class))
	t.File(d+"/numa_node", fmt.Sprint(f.NUMA))
	if f.LocalCPUs != "" {
		t.File(d+"/local_cpulist", f.LocalCPUs)
	}
	if f.LinkGTps > 0 {
		t.File(d+"/current_link_speed", fmt.Sprintf("%.1f GT/s PCIe", f.LinkGTps))
		t.File(d+"/current_link_width", fmt.Sprint(f.LinkWidth))
	}
	if f.Driver != "" {
		// A file keeps the directory in git, which stores no empty ones.
		t.File("sys/bus/pci/drivers/"+f.Driver+"/uevent", "DRIVER="+f.Driver)
		t.Link(d+"/driver", "/sys/bus/pci/drivers/"+f.Driver)
	}
	t.Link("sys/bus/pci/devices/"+addr, "/"+d)
	return d
}

// Bridge writes a PCI-to-PCI bridge function (class 0x060400).
func (t *Tree) Bridge(parent, addr string, vendor, device uint16, numa int, gtps float64, width int) string {
	return t.PCI(parent, addr, PCI{Vendor: vendor, Device: device, Class: 0x060400, NUMA: numa, Driver: "pcieport", LinkGTps: gtps, LinkWidth: width})
}

// Switch writes a PCIe switch under parent: an upstream port at up and one
// downstream port per address in downs. It returns the downstream ports'
// directories.
func (t *Tree) Switch(parent, up string, downs []string, vendor, device uint16, numa int, gtps float64) []string {
	u := t.Bridge(parent, up, vendor, device, numa, gtps, 16)
	var out []string
	for _, d := range downs {
		out = append(out, t.Bridge(u, d, vendor, device, numa, gtps, 16))
	}
	return out
}

// NetDev writes sys/class/net/<name> for a NIC whose PCI function lives
// in pciDir: speed in Mb/s (-1 for unknown), operstate.
func (t *Tree) NetDev(pciDir, name string, speedMbps int, operstate string) *Tree {
	d := pciDir + "/net/" + name
	t.File(d+"/speed", fmt.Sprint(speedMbps))
	t.File(d+"/operstate", operstate)
	t.File(d+"/address", "02:00:00:00:00:01")
	t.Link(d+"/device", "/"+pciDir)
	t.Link("sys/class/net/"+name, "/"+d)
	return t
}

// VirtualNetDev writes a netdev without hardware (lo, docker0).
func (t *Tree) VirtualNetDev(name string) *Tree {
	d := "sys/devices/virtual/net/" + name
	t.File(d+"/speed", "-1")
	t.File(d+"/operstate", "unknown")
	t.Link("sys/class/net/"+name, "/"+d)
	return t
}

// RDMA writes sys/class/infiniband/<name> for the PCI function in pciDir
// with one port: rate ("400 Gb/sec (4X NDR)"), state ("4: ACTIVE") and link
// layer ("InfiniBand" or "Ethernet").
func (t *Tree) RDMA(pciDir, name, rate, state, linkLayer, fw string) *Tree {
	d := pciDir + "/infiniband/" + name
	t.File(d+"/ports/1/rate", rate)
	t.File(d+"/ports/1/state", state)
	t.File(d+"/ports/1/link_layer", linkLayer)
	if fw != "" {
		t.File(d+"/fw_ver", fw)
	}
	t.File(d+"/node_type", "1: CA")
	t.Link(d+"/device", "/"+pciDir)
	t.Link("sys/class/infiniband/"+name, "/"+d)
	return t
}

// DevNode writes an empty regular file standing for a character device.
func (t *Tree) DevNode(rel string) *Tree { return t.File(rel, "") }
