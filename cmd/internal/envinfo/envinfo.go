package envinfo

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"runtime/debug"
	"slices"
	"sort"
	"strings"

	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/render"
)

// Manifest is the env report. Empty fields are omitted.
type Manifest struct {
	Kernel       string         `json:"kernel,omitempty"`
	KernelBuild  string         `json:"kernel_build,omitempty"`
	Distribution string         `json:"distribution,omitempty"`
	Arch         string         `json:"arch"`
	Go           string         `json:"go"`
	Tensorlane   Version        `json:"tensorlane"`
	CPU          string         `json:"cpu,omitempty"`
	CPUs         int            `json:"cpus"`
	NUMANodes    int            `json:"numa_nodes"`
	Accelerators map[string]int `json:"accelerators"`
	// Components maps a component ("nvidia-driver", "cuda", "rocm",
	// "neuron-driver", "habanalabs-driver", "libibverbs", "mlx5_core", ...)
	// to its version.
	Components map[string]string `json:"components"`
	// NICFirmware maps RDMA devices to their firmware version.
	NICFirmware map[string]string `json:"nic_firmware,omitempty"`
	// RDMAProviders says, on a live system, which rdma providers can run
	// ("soft", "ofi") and why not, and which one is selected.
	RDMAProviders map[string]string `json:"rdma_providers,omitempty"`
	// Python is the Python environment of the tests (ReadPython), set by
	// the caller that knows where it is.
	Python   *PythonEnv `json:"python,omitempty"`
	Warnings int        `json:"discovery_warnings"`
	// SharedMemoryHugePages is the kernel's transparent huge page policy
	// for shared memory (never, advise, within_size, always, ...): with
	// "never", mapping a fresh grant builds a page-table entry per 4 KiB
	// page, which is most of a cold on-host transfer's cost.
	SharedMemoryHugePages string `json:"shmem_huge_pages,omitempty"`
	// CUDA is what the CUDA driver API says (live machine only).
	CUDA *CUDAReport `json:"cuda_driver_api,omitempty"`
	// Devices is the device memory section (devices.go; live machine only).
	Devices *DeviceReport `json:"device_memory,omitempty"`
}

// Version is this binary's tensorlane version, from its build info.
type Version struct {
	Version string `json:"version"`
	// Note says why Version is only "(devel)": nothing recorded one.
	Note     string `json:"note,omitempty"`
	Revision string `json:"revision,omitempty"`
	Modified bool   `json:"modified,omitempty"`
	Module   string `json:"module,omitempty"`
}

// Collect reads the manifest of the system under root ("" or "/": this
// machine, where the CUDA driver and the rdma providers are probed too).
func Collect(ctx context.Context, root string) Manifest {
	if ctx == nil {
		ctx = context.Background()
	}
	fs := topology.NewFS(root)
	live := fs.Root() == "/"
	m := Manifest{Arch: runtime.GOOS + "/" + runtime.GOARCH, Go: runtime.Version(),
		Accelerators: map[string]int{}, Components: map[string]string{}}
	read := func(p string) string {
		s, err := fs.ReadAttr(p)
		if err != nil {
			return ""
		}
		return s
	}
	m.Kernel = read("proc/sys/kernel/osrelease")
	m.KernelBuild = read("proc/sys/kernel/version")
	m.Distribution = osRelease(read("etc/os-release"))
	m.Tensorlane = BuildVersion()
	m.SharedMemoryHugePages = selected(read("sys/kernel/mm/transparent_hugepage/shmem_enabled"))
	if ci := read("proc/cpuinfo"); ci != "" {
		for _, line := range strings.Split(ci, "\n") {
			if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == "model name" {
				m.CPU = strings.TrimSpace(v)
				break
			}
		}
	}
	if live {
		r := ProbeCUDA()
		m.CUDA = &r
		if r.Version != "" {
			m.Components["cuda-driver-api"] = r.Version
		}
	}
	if d, err := topology.Discover(ctx, topology.DiscoverConfig{Root: root}); err == nil {
		if m.CUDA != nil {
			ApplyCUDA(d, *m.CUDA)
		}
		m.NUMANodes = len(d.Host.NUMA)
		m.CPUs = render.CPUCount(d.Host)
		for _, dev := range d.Host.Devices {
			m.Accelerators[dev.Vendor+" "+dev.Model]++
		}
		for _, n := range d.Host.NICs {
			if n.RDMA() && n.Firmware != "" {
				if m.NICFirmware == nil {
					m.NICFirmware = map[string]string{}
				}
				m.NICFirmware[n.RDMADevice] = n.Firmware
			}
		}
		m.Warnings = len(d.Warnings)
		if live {
			r := ProbeDevices(ctx, d.Host) // devices.go
			m.Devices = &r
		}
	}
	if live && m.CPUs == 0 {
		m.CPUs = runtime.NumCPU()
	}
	// Drivers: the kernel modules' version files.
	for mod, name := range map[string]string{
		"nvidia": "nvidia-driver", "nvidia_fs": "nvidia-gds", "amdgpu": "amdgpu-driver", "neuron": "neuron-driver",
		"habanalabs": "habanalabs-driver", "mlx5_core": "mlx5_core", "efa": "efa", "bnxt_en": "bnxt_en",
		"ib_core": "ib_core", "irdma": "irdma",
	} {
		if v := read("sys/module/" + mod + "/version"); v != "" && len(v) < 64 {
			m.Components[name] = v
		}
	}
	if v := read("proc/driver/nvidia/version"); v != "" {
		if mm := regexp.MustCompile(`Kernel Module\s+(\S+)`).FindStringSubmatch(v); mm != nil {
			m.Components["nvidia-driver"] = mm[1]
		}
	}
	if v := read("usr/local/cuda/version.json"); v != "" {
		var cj struct {
			CUDA struct {
				Version string `json:"version"`
			} `json:"cuda"`
		}
		if json.Unmarshal([]byte(v), &cj) == nil && cj.CUDA.Version != "" {
			m.Components["cuda"] = cj.CUDA.Version
		}
	} else if v := read("usr/local/cuda/version.txt"); v != "" {
		m.Components["cuda"] = strings.TrimPrefix(v, "CUDA Version ")
	}
	if v := read("opt/rocm/.info/version"); v != "" {
		m.Components["rocm"] = v
	}
	if v := read("opt/habanalabs/version"); v != "" {
		m.Components["habana-software"] = v
	}
	// Shared libraries: versions from the file names.
	for _, lib := range []struct{ name, prefix string }{
		{"libibverbs", "libibverbs.so."}, {"librdmacm", "librdmacm.so."}, {"libnvidia-ml", "libnvidia-ml.so."},
		{"libcuda", "libcuda.so."}, {"libnccl", "libnccl.so."}, {"librccl", "librccl.so."},
		{"libnrt (neuron runtime)", "libnrt.so."}, {"libhl-thunk (gaudi)", "libhl-thunk.so"}, {"libfabric", "libfabric.so."},
	} {
		if v := libVersion(fs, lib.prefix); v != "" {
			m.Components[lib.name] = v
		}
	}
	// Distribution packages the tests use (scripts/deps.sh): the package
	// version, which for libfabric is not its library file's (1.17 ships
	// libfabric.so.1.20).
	status, _ := os.ReadFile(filepath.Join(fs.Root(), "var/lib/dpkg/status")) // a few MiB: too big for ReadAttr
	for pkg, v := range dpkgVersions(string(status), dpkgPackages) {
		m.Components["deb "+pkg] = v
	}
	if live {
		m.RDMAProviders = rdmaProviders()
	}
	return m
}

var libDirs = []string{"usr/lib/x86_64-linux-gnu", "usr/lib/aarch64-linux-gnu", "usr/lib64", "usr/lib", "lib64",
	"usr/local/lib", "usr/local/cuda/lib64", "opt/rocm/lib", "opt/aws/neuron/lib", "opt/amazon/efa/lib", "opt/amazon/efa/lib64", "opt/habanalabs/lib"}

// libVersion finds the longest-versioned file name starting with prefix in
// the usual library directories ("libibverbs.so.1.14.50.0" → "1.14.50.0").
func libVersion(fs topology.FS, prefix string) string {
	best := ""
	for _, d := range libDirs {
		for _, n := range fs.Glob(d, prefix) {
			v := strings.TrimPrefix(strings.TrimPrefix(n, prefix), ".")
			if v == "" {
				v = "present"
			}
			if len(v) > len(best) {
				best = v
			}
		}
	}
	return best
}

func osRelease(s string) string {
	for _, line := range strings.Split(s, "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			return strings.Trim(v, `"`)
		}
	}
	return ""
}

// BuildVersion reads the version, revision and module of this binary
// from its build info, and says why there is none when nothing was stamped.
func BuildVersion() Version {
	v := Version{Version: "(devel)"}
	bi, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	v.Module = bi.Main.Path
	if bi.Main.Version != "" {
		v.Version = bi.Main.Version
	}
	for _, s := range bi.Settings {
		switch s.Key {
		case "vcs.revision":
			v.Revision = s.Value
		case "vcs.modified":
			v.Modified = s.Value == "true"
		}
	}
	if v.Version == "(devel)" && v.Revision == "" {
		v.Note = "no version stamped: built by go run or go test, with -buildvcs=false, or outside a git checkout"
	}
	return v
}

// Write prints m as `tensorlane env` does, one "key: value" a line.
func Write(w io.Writer, m Manifest) {
	line := func(k, v string) {
		if v != "" {
			fmt.Fprintf(w, "%-22s %s\n", k+":", v)
		}
	}
	line("kernel", m.Kernel)
	line("kernel build", m.KernelBuild)
	line("distribution", m.Distribution)
	line("arch", m.Arch)
	line("go", m.Go)
	tv := m.Tensorlane.Version
	if m.Tensorlane.Revision != "" {
		tv += " " + m.Tensorlane.Revision
		if m.Tensorlane.Modified {
			tv += " (modified)"
		}
	}
	if m.Tensorlane.Note != "" {
		tv += " (" + m.Tensorlane.Note + ")"
	}
	line("tensorlane", tv)
	line("cpu", m.CPU)
	line("cpus", fmt.Sprintf("%d on %d NUMA node(s)", m.CPUs, m.NUMANodes))
	switch m.SharedMemoryHugePages {
	case "":
	case "never", "deny":
		line("shmem huge pages", m.SharedMemoryHugePages+" (cold on-host transfers build 4 KiB page tables; \"advise\" in /sys/kernel/mm/transparent_hugepage/shmem_enabled lets tensorlane use 2 MiB pages)")
	default:
		line("shmem huge pages", m.SharedMemoryHugePages)
	}
	if len(m.Accelerators) == 0 {
		line("accelerators", "none found")
	}
	for _, k := range sortedKeys(m.Accelerators) {
		line("accelerator", fmt.Sprintf("%d x %s", m.Accelerators[k], k))
	}
	for _, k := range sortedKeys(m.Components) {
		line(k, m.Components[k])
	}
	for _, k := range sortedKeys(m.NICFirmware) {
		line("firmware "+k, m.NICFirmware[k])
	}
	for _, k := range sortedKeys(m.RDMAProviders) {
		line("rdma provider "+k, m.RDMAProviders[k])
	}
	if p := m.Python; p != nil {
		line("python", p.Version+" ("+p.Prefix+")")
		for _, k := range KeyPackages {
			line(k, p.Key[k])
		}
	}
	if len(m.Components) == 0 {
		line("drivers/libraries", "none of NVIDIA, CUDA, ROCm, Neuron, Gaudi, libibverbs found")
	}
	if m.CUDA != nil {
		if m.CUDA.Unavailable != "" {
			line("cuda driver api", "not usable: "+m.CUDA.Unavailable)
		}
		for _, d := range m.CUDA.Devices {
			line("cuda device", d)
		}
	}
	if m.Devices != nil {
		WriteDevices(w, *m.Devices) // devices.go
	}
	if m.Warnings > 0 {
		line("discovery warnings", fmt.Sprintf("%d (tensorlane topo lists them)", m.Warnings))
	}
}

func sortedKeys[V any](m map[string]V) []string {
	ks := make([]string, 0, len(m))
	for k := range m {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}

// selected returns the bracketed choice of a sysfs policy file
// ("always within_size advise [never] deny force" -> "never").
func selected(policy string) string {
	_, rest, ok := strings.Cut(policy, "[")
	if !ok {
		return strings.TrimSpace(policy)
	}
	choice, _, _ := strings.Cut(rest, "]")
	return choice
}

// dpkgPackages are the Debian packages env reports when installed.
var dpkgPackages = []string{"libfabric1", "libfabric-bin", "graphviz", "chromium-headless-shell", "chromium", "gcc", "iproute2"}

// dpkgVersions reads the installed versions of pkgs from dpkg's status file.
func dpkgVersions(status string, pkgs []string) map[string]string {
	out := map[string]string{}
	for _, stanza := range strings.Split(status, "\n\n") {
		var name, ver string
		installed := false
		for _, line := range strings.Split(stanza, "\n") {
			switch {
			case strings.HasPrefix(line, "Package: "):
				name = strings.TrimPrefix(line, "Package: ")
			case strings.HasPrefix(line, "Version: "):
				ver = strings.TrimPrefix(line, "Version: ")
			case strings.HasPrefix(line, "Status: "):
				installed = strings.HasSuffix(line, " installed")
			}
		}
		if installed && ver != "" && slices.Contains(pkgs, name) {
			out[name] = ver
		}
	}
	return out
}
