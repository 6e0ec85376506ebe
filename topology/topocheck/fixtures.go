package topocheck

import (
	"fmt"
	"strings"
)

// Fixture is a realistic system tree that a discovery test can be run on.
type Fixture struct {
	// Name is the directory name under topology/testdata/sysfs.
	Name string
	// Plugin is the built-in plugin the fixture exercises ("" for none).
	Plugin string
	// Env is the environment discovery should see on that machine.
	Env map[string]string
	// Build writes the tree under root.
	Build func(root string) error
	// Want summarises what discovery must find.
	Want Want
}

// Want is the expected shape of a discovered host.
type Want struct {
	Devices, RDMANICs, NICs, NUMA, Links int
}

// Fixtures returns the built-in fixtures: a DGX-H100-like host, an
// MI300X-like host, a TPU v5p host, a trn2 host, a Gaudi 3 host and a plain
// VM.
func Fixtures() []Fixture {
	return []Fixture{
		{Name: "dgx-h100", Plugin: "nvidia", Build: BuildDGXH100, Want: Want{Devices: 8, RDMANICs: 9, NICs: 10, NUMA: 2, Links: 28}},
		{Name: "mi300x", Plugin: "amd", Build: BuildMI300X, Want: Want{Devices: 8, RDMANICs: 8, NICs: 9, NUMA: 2, Links: 28}},
		{Name: "tpu-v5p", Plugin: "tpu", Build: BuildTPUv5p, Want: Want{Devices: 4, RDMANICs: 0, NICs: 1, NUMA: 2, Links: 4},
			Env: map[string]string{"TPU_NAME": "v5p-train-7", "TPU_WORKER_ID": "1", "TPU_TOPOLOGY": "2x2x4", "TPU_ACCELERATOR_TYPE": "v5p-32"}},
		{Name: "trn2", Plugin: "neuron", Build: BuildTrn2, Want: Want{Devices: 16, RDMANICs: 16, NICs: 17, NUMA: 2, Links: 32}},
		{Name: "gaudi3", Plugin: "gaudi", Build: BuildGaudi3, Want: Want{Devices: 8, RDMANICs: 4, NICs: 5, NUMA: 2, Links: 28}},
		{Name: "vm", Build: BuildVM, Want: Want{Devices: 0, RDMANICs: 0, NICs: 1, NUMA: 1, Links: 0}},
	}
}

func bdf(bus, dev, fn int) string { return fmt.Sprintf("0000:%02x:%02x.%d", bus, dev, fn) }

func common(t *Tree, hostname, osRelease string) {
	t.File("proc/sys/kernel/hostname", hostname)
	t.File("proc/sys/kernel/osrelease", "6.8.0-45-generic")
	t.File("proc/version", "Linux version 6.8.0-45-generic (buildd@lcy02-amd64-115) (gcc 13.2.0) #45-Ubuntu SMP")
	t.File("etc/os-release", osRelease)
	t.VirtualNetDev("lo")
	t.VirtualNetDev("docker0")
}

const ubuntu2204 = `PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
ID=ubuntu`

// BuildDGXH100 writes a DGX-H100-like host: two sockets, four root
// complexes, each with a PCIe switch fanning out to two leaf switches that
// each hold one H100 SXM5 and one ConnectX-7 (InfiniBand NDR); four
// NVSwitches; a ConnectX-7 RoCE storage NIC and an Intel management NIC.
func BuildDGXH100(root string) error {
	t := NewTree(root)
	common(t, "dgx-h100-01", ubuntu2204)
	t.NUMANode(0, "0-55,112-167", []int{10, 21}, 1056375100)
	t.NUMANode(1, "56-111,168-223", []int{21, 10}, 1056969500)
	for k := 0; k < 4; k++ {
		numa := k / 2
		hbBus := []int{0x10, 0x30, 0x90, 0xb0}[k]
		hb := t.HostBridge(fmt.Sprintf("0000:%02x", hbBus))
		rp := t.Bridge(hb, bdf(hbBus, 1, 0), 0x8086, 0x352a, numa, 32, 16)
		up := t.Switch(rp, bdf(hbBus+1, 0, 0), []string{bdf(hbBus+2, 0, 0), bdf(hbBus+2, 1, 0)}, 0x1000, 0xc030, numa, 32)
		for j := 0; j < 2; j++ {
			g := 2*k + j
			b := hbBus + 3 + 4*j
			leaf := t.Switch(up[j], bdf(b, 0, 0), []string{bdf(b+1, 0, 0), bdf(b+1, 1, 0)}, 0x1000, 0xc030, numa, 32)
			gpu := bdf(b+2, 0, 0)
			t.PCI(leaf[0], gpu, PCI{Vendor: 0x10de, Device: 0x2330, SubVendor: 0x10de, SubDevice: 0x16c1, Class: 0x030200,
				NUMA: numa, Driver: "nvidia", LinkGTps: 32, LinkWidth: 16})
			t.File("proc/driver/nvidia/gpus/"+gpu+"/information", fmt.Sprintf(
				"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t %d\nGPU UUID: \t GPU-8f3c1e2a-0000-4000-8000-00000000000%d\nVideo BIOS: \t 96.00.74.00.0d\nBus Type: \t PCIe\nDMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t %s\nDevice Minor: \t %d\nGPU Excluded:\t No",
				300+g, g, gpu, g))
			t.DevNode(fmt.Sprintf("dev/nvidia%d", g))
			nic := t.PCI(leaf[1], bdf(b+3, 0, 0), PCI{Vendor: 0x15b3, Device: 0x1021, SubVendor: 0x15b3, SubDevice: 0x0041, Class: 0x020700,
				NUMA: numa, Driver: "mlx5_core", LinkGTps: 32, LinkWidth: 16})
			t.NetDev(nic, fmt.Sprintf("ibp%ds0", b+3), 400000, "up")
			t.RDMA(nic, fmt.Sprintf("mlx5_%d", g), "400 Gb/sec (4X NDR)", "4: ACTIVE", "InfiniBand", "28.39.1002")
		}
	}
	// NVSwitches and the storage / management NICs on the last complex.
	hb := t.HostBridge("0000:e0")
	rp := t.Bridge(hb, bdf(0xe0, 1, 0), 0x8086, 0x352a, 1, 16, 16)
	downs := t.Switch(rp, bdf(0xe1, 0, 0), []string{bdf(0xe2, 0, 0), bdf(0xe2, 1, 0), bdf(0xe2, 2, 0), bdf(0xe2, 3, 0), bdf(0xe2, 4, 0)}, 0x1000, 0xc010, 1, 16)
	for i := 0; i < 4; i++ {
		t.PCI(downs[i], bdf(0xe3+i, 0, 0), PCI{Vendor: 0x10de, Device: 0x22a3, Class: 0x068000, NUMA: 1, Driver: "nvidia-nvswitch", LinkGTps: 16, LinkWidth: 2})
	}
	st := t.PCI(downs[4], bdf(0xe8, 0, 0), PCI{Vendor: 0x15b3, Device: 0x1021, Class: 0x020000, NUMA: 1, Driver: "mlx5_core", LinkGTps: 32, LinkWidth: 16})
	t.NetDev(st, "enp232s0np0", 400000, "up")
	t.RDMA(st, "mlx5_8", "400 Gb/sec (4X NDR)", "4: ACTIVE", "Ethernet", "28.39.1002")
	hb0 := t.HostBridge("0000:00")
	mgmt := t.PCI(hb0, bdf(0x00, 0x1f, 6), PCI{Vendor: 0x8086, Device: 0x1572, Class: 0x020000, NUMA: 0, Driver: "i40e"})
	t.NetDev(mgmt, "eno1", 10000, "up")
	t.DevNode("dev/nvidiactl")
	t.File("proc/driver/nvidia/version", "NVRM version: NVIDIA UNIX x86_64 Kernel Module  550.90.07  Fri May 31 09:35:42 UTC 2024\nGCC version:  gcc version 12.3.0")
	t.File("sys/module/nvidia/version", "550.90.07")
	t.File("sys/module/mlx5_core/version", "24.04-0.7.0")
	return t.Err()
}

// BuildMI300X writes an MI300X-like host: two EPYC sockets with four root
// complexes each, one MI300X per complex behind a PCIe switch that also
// holds a Broadcom 400G RoCE NIC; KFD topology with an xGMI hive.
func BuildMI300X(root string) error {
	t := NewTree(root)
	common(t, "mi300x-node-3", ubuntu2204)
	t.NUMANode(0, "0-95,192-287", []int{10, 32}, 1584563200)
	t.NUMANode(1, "96-191,288-383", []int{32, 10}, 1585000000)
	kfd := "sys/class/kfd/kfd/topology/nodes"
	for n := 0; n < 2; n++ {
		t.File(fmt.Sprintf("%s/%d/properties", kfd, n), fmt.Sprintf("cpu_cores_count 96\nsimd_count 0\nmem_banks_count 1\nlocation_id 0\ndomain 0\nhive_id 0\nnode_from %d", n))
	}
	for g := 0; g < 8; g++ {
		numa := g / 4
		hbBus := g * 0x20
		hb := t.HostBridge(fmt.Sprintf("0000:%02x", hbBus))
		rp := t.Bridge(hb, bdf(hbBus, 1, 1), 0x1022, 0x14ab, numa, 32, 16)
		downs := t.Switch(rp, bdf(hbBus+1, 0, 0), []string{bdf(hbBus+2, 0, 0), bdf(hbBus+2, 1, 0)}, 0x1000, 0xc030, numa, 32)
		gpuBus := hbBus + 3
		gpu := bdf(gpuBus, 0, 0)
		t.PCI(downs[0], gpu, PCI{Vendor: 0x1002, Device: 0x74a1, SubVendor: 0x1002, SubDevice: 0x74a1, Class: 0x120000,
			NUMA: numa, Driver: "amdgpu", LinkGTps: 32, LinkWidth: 16})
		t.DevNode(fmt.Sprintf("dev/dri/renderD%d", 128+g))
		nic := t.PCI(downs[1], bdf(gpuBus+1, 0, 0), PCI{Vendor: 0x14e4, Device: 0x1760, Class: 0x020000, NUMA: numa, Driver: "bnxt_en", LinkGTps: 32, LinkWidth: 16})
		t.NetDev(nic, fmt.Sprintf("enp%ds0np0", gpuBus+1), 400000, "up")
		t.RDMA(nic, fmt.Sprintf("bnxt_re%d", g), "400 Gb/sec (4X)", "4: ACTIVE", "Ethernet", "230.2.49.0")
		node := fmt.Sprintf("%s/%d", kfd, g+2)
		t.File(node+"/properties", fmt.Sprintf(
			"cpu_cores_count 0\nsimd_count 1216\nmem_banks_count 1\ngfx_target_version 90402\nlocation_id %d\ndomain 0\ndrm_render_minor %d\nhive_id 12345678901234567890\nunique_id %d\nnum_xcc 8\nvendor_id 4098\ndevice_id 29857",
			gpuBus<<8, 128+g, 0x1a2b3c4d5e6f0000+uint64(g)))
		t.File(node+"/mem_banks/0/properties", fmt.Sprintf("heap_type 1\nsize_in_bytes %d\nwidth 8192", int64(192)<<30))
		t.File(node+"/io_links/0/properties", fmt.Sprintf("type 2\nnode_from %d\nnode_to %d\nweight 20\nmin_bandwidth 312\nmax_bandwidth 64000", g+2, numa))
		l := 1
		for h := 0; h < 8; h++ {
			if h == g {
				continue
			}
			t.File(fmt.Sprintf("%s/io_links/%d/properties", node, l), fmt.Sprintf("type 11\nnode_from %d\nnode_to %d\nweight 15\nmin_bandwidth 50000\nmax_bandwidth 64000", g+2, h+2))
			l++
		}
	}
	mgmt := t.PCI("sys/devices/pci0000:00", bdf(0x00, 0x08, 1), PCI{Vendor: 0x8086, Device: 0x1521, Class: 0x020000, NUMA: 0, Driver: "igb"})
	t.NetDev(mgmt, "eno1", 1000, "up")
	t.DevNode("dev/kfd")
	t.File("sys/module/amdgpu/version", "6.8.5")
	t.File("opt/rocm/.info/version", "6.2.1-112")
	return t.Err()
}

// BuildTPUv5p writes a TPU v5p VM: four chips on the root bus, a gVNIC and
// /dev/accel0..3.
func BuildTPUv5p(root string) error {
	t := NewTree(root)
	common(t, "t1v-n-4b2a9f1e-w-1", `PRETTY_NAME="Ubuntu 22.04.4 LTS"
NAME="Ubuntu"
VERSION_ID="22.04"
ID=ubuntu`)
	t.NUMANode(0, "0-51,104-155", []int{10, 20}, 234881024)
	t.NUMANode(1, "52-103,156-207", []int{20, 10}, 234881024)
	hb := t.HostBridge("0000:00")
	t.PCI(hb, bdf(0, 0, 0), PCI{Vendor: 0x8086, Device: 0x1237, Class: 0x060000, NUMA: -1})
	for c := 0; c < 4; c++ {
		t.PCI(hb, bdf(0, 5+c, 0), PCI{Vendor: 0x1ae0, Device: 0x0062, SubVendor: 0x1ae0, SubDevice: 0x0062, Class: 0x120000, NUMA: c / 2, Driver: "vfio-pci", LinkGTps: 16, LinkWidth: 16})
		t.DevNode(fmt.Sprintf("dev/accel%d", c))
	}
	nic := t.PCI(hb, bdf(0, 0x04, 0), PCI{Vendor: 0x1ae0, Device: 0x0042, Class: 0x020000, NUMA: 0, Driver: "gve"})
	t.NetDev(nic, "ens8", 200000, "up")
	return t.Err()
}

// BuildTrn2 writes a trn2.48xlarge-like host: 16 Trainium2 devices, two
// per PCIe switch with their two EFA devices, /dev/neuron0..15, NeuronLink
// neighbours of a 4x4 torus, and an ENA.
func BuildTrn2(root string) error {
	t := NewTree(root)
	common(t, "ip-10-1-77-12", `PRETTY_NAME="Amazon Linux 2023.5.20240805"
NAME="Amazon Linux"
VERSION_ID="2023"
ID="amzn"`)
	t.NUMANode(0, "0-47,96-143", []int{10, 32}, 1056000000)
	t.NUMANode(1, "48-95,144-191", []int{32, 10}, 1056000000)
	for k := 0; k < 4; k++ {
		numa := k / 2
		hbBus := 0x10 + k*0x40
		hb := t.HostBridge(fmt.Sprintf("0000:%02x", hbBus))
		for j := 0; j < 2; j++ {
			sw := 2*k + j
			b := hbBus + 1 + j*0x10
			rp := t.Bridge(hb, bdf(hbBus, 1+j, 0), 0x1d0f, 0x0200, numa, 32, 16)
			downs := t.Switch(rp, bdf(b, 0, 0), []string{bdf(b+1, 0, 0), bdf(b+1, 1, 0), bdf(b+1, 2, 0), bdf(b+1, 3, 0)}, 0x1000, 0xc030, numa, 32)
			for c := 0; c < 2; c++ {
				chip := 2*sw + c
				t.PCI(downs[c], bdf(b+2+c, 0, 0), PCI{Vendor: 0x1d0f, Device: 0x7364, Class: 0x088000, NUMA: numa, Driver: "neuron", LinkGTps: 32, LinkWidth: 16})
				t.DevNode(fmt.Sprintf("dev/neuron%d", chip))
				x, y := chip%4, chip/4
				n := []int{y*4 + (x+3)%4, y*4 + (x+1)%4, ((y+3)%4)*4 + x, ((y+1)%4)*4 + x}
				t.File(fmt.Sprintf("sys/devices/virtual/neuron_device/neuron%d/connected_devices", chip), strings.Trim(strings.Join(strings.Fields(fmt.Sprint(n)), ", "), "[]"))
				t.Link(fmt.Sprintf("sys/class/neuron_device/neuron%d", chip), fmt.Sprintf("/sys/devices/virtual/neuron_device/neuron%d", chip))
				efa := t.PCI(downs[2+c], bdf(b+4+c, 0, 0), PCI{Vendor: 0x1d0f, Device: 0xefa2, Class: 0x020000, NUMA: numa, Driver: "efa", LinkGTps: 32, LinkWidth: 8})
				t.RDMA(efa, fmt.Sprintf("rdmap%ds0", b+4+c), "200 Gb/sec (4X HDR)", "4: ACTIVE", "Unspecified", "")
			}
		}
	}
	ena := t.PCI("sys/devices/pci0000:00", bdf(0, 5, 0), PCI{Vendor: 0x1d0f, Device: 0xec20, Class: 0x020000, NUMA: 0, Driver: "ena"})
	t.NetDev(ena, "ens5", -1, "up")
	t.File("sys/module/neuron/version", "2.18.12.0")
	t.File("sys/module/efa/version", "2.10.0g")
	return t.Err()
}

// BuildGaudi3 writes a Gaudi 3 HLS-like host: 8 Gaudi3 behind four PCIe
// switches, /dev/accel/accel0..7 with their sysfs class entries, and four
// ConnectX-7 RoCE scale-out NICs.
func BuildGaudi3(root string) error {
	t := NewTree(root)
	common(t, "hls3-node-12", ubuntu2204)
	t.NUMANode(0, "0-59,120-179", []int{10, 21}, 1056000000)
	t.NUMANode(1, "60-119,180-239", []int{21, 10}, 1056000000)
	for k := 0; k < 4; k++ {
		numa := k / 2
		hbBus := 0x18 + k*0x30
		hb := t.HostBridge(fmt.Sprintf("0000:%02x", hbBus))
		rp := t.Bridge(hb, bdf(hbBus, 1, 0), 0x8086, 0x352a, numa, 32, 16)
		downs := t.Switch(rp, bdf(hbBus+1, 0, 0), []string{bdf(hbBus+2, 0, 0), bdf(hbBus+2, 1, 0), bdf(hbBus+2, 2, 0)}, 0x1000, 0xc030, numa, 32)
		for j := 0; j < 2; j++ {
			g := 2*k + j
			addr := bdf(hbBus+3+j, 0, 0)
			d := t.PCI(downs[j], addr, PCI{Vendor: 0x1da3, Device: 0x1060, Class: 0x120000, NUMA: numa, Driver: "habanalabs", LinkGTps: 32, LinkWidth: 16})
			t.File(d+"/accel/accel"+fmt.Sprint(g)+"/dev", fmt.Sprintf("261:%d", g))
			t.File(d+"/module_id", fmt.Sprint(g))
			t.Link(fmt.Sprintf("sys/class/accel/accel%d", g), fmt.Sprintf("/%s/accel/accel%d", d, g))
			t.Link(fmt.Sprintf("%s/accel/accel%d/device", d, g), "/"+d)
			t.DevNode(fmt.Sprintf("dev/accel/accel%d", g))
			t.DevNode(fmt.Sprintf("dev/accel/accel_controlD%d", g))
		}
		nic := t.PCI(downs[2], bdf(hbBus+5, 0, 0), PCI{Vendor: 0x15b3, Device: 0x1021, Class: 0x020000, NUMA: numa, Driver: "mlx5_core", LinkGTps: 32, LinkWidth: 16})
		t.NetDev(nic, fmt.Sprintf("enp%ds0np0", hbBus+5), 400000, "up")
		t.RDMA(nic, fmt.Sprintf("mlx5_%d", k), "400 Gb/sec (4X NDR)", "4: ACTIVE", "Ethernet", "28.41.1000")
	}
	mgmt := t.PCI("sys/devices/pci0000:00", bdf(0, 0x1f, 6), PCI{Vendor: 0x8086, Device: 0x1572, Class: 0x020000, NUMA: 0, Driver: "i40e"})
	t.NetDev(mgmt, "eno1", 10000, "up")
	t.File("sys/module/habanalabs/version", "1.18.0-524")
	return t.Err()
}

// BuildVM writes a small virtual machine like the CI machines: one NUMA
// node, virtio functions only, eth0 without a known speed.
func BuildVM(root string) error {
	t := NewTree(root)
	t.File("proc/sys/kernel/hostname", "vm")
	t.File("proc/sys/kernel/osrelease", "6.1.0-18-amd64")
	t.File("etc/os-release", `PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"
NAME="Debian GNU/Linux"
VERSION_ID="12"
ID=debian`)
	t.VirtualNetDev("lo")
	t.File("sys/devices/system/node/node0/cpulist", "0-1")
	t.File("sys/devices/system/node/node0/distance", "10")
	t.File("sys/devices/system/node/has_cpu", "0")
	t.File("sys/devices/system/node/online", "0")
	t.File("sys/devices/system/cpu/online", "0-1")
	hb := t.HostBridge("0000:00")
	t.PCI(hb, bdf(0, 0, 0), PCI{Vendor: 0x8086, Device: 0x0d57, Class: 0x060000, NUMA: -1})
	t.PCI(hb, bdf(0, 1, 0), PCI{Vendor: 0x1af4, Device: 0x1045, Class: 0xffff00, NUMA: -1, Driver: "virtio-pci"})
	t.PCI(hb, bdf(0, 2, 0), PCI{Vendor: 0x1af4, Device: 0x1042, Class: 0x018000, NUMA: -1, Driver: "virtio-pci"})
	net := t.PCI(hb, bdf(0, 3, 0), PCI{Vendor: 0x1af4, Device: 0x1041, Class: 0x020000, NUMA: -1, Driver: "virtio-pci"})
	t.Dir(net + "/virtio2")
	t.NetDev(net+"/virtio2", "eth0", -1, "up")
	return t.Err()
}
