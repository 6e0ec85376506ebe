package cuda

import (
	"fmt"
)

// DeviceInfo is what the driver says about one GPU.
type DeviceInfo struct {
	Ordinal       int
	Name          string
	UUID          string // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as nvidia-smi prints it
	PCIBusID      string // "0000:18:00.0"
	TotalMemory   int64  // bytes
	Compute       [2]int // compute capability (9.0 for H100/H200)
	SMs           int
	NUMANode      int  // -1 when the driver does not say
	VMM           bool // cuMemCreate/cuMemMap
	PosixFD       bool // VMM allocations exportable as POSIX fds
	Fabric        bool // VMM allocations exportable as fabric handles (multi-node NVLink)
	GPUDirectRDMA bool
	DMABuf        bool // memory exportable as a dma-buf fd (cuMemGetHandleForAddressRange), for NIC registration
	// Peers lists the ordinals this device can access directly
	// (cuDeviceCanAccessPeer: NVLink or PCIe P2P).
	Peers []int
}

// DeviceCount returns the number of CUDA devices the driver sees.
func (d *Driver) DeviceCount() (int, error) {
	var n int32
	if r := d.api.cuDeviceGetCount(&n); r != Success {
		return 0, d.err("cuDeviceGetCount", r)
	}
	return int(n), nil
}

// Devices describes every device the driver sees.
func (d *Driver) Devices() ([]DeviceInfo, error) {
	n, err := d.DeviceCount()
	if err != nil {
		return nil, err
	}
	out := make([]DeviceInfo, 0, n)
	for i := range n {
		info, err := d.Device(i)
		if err != nil {
			return nil, err
		}
		out = append(out, info)
	}
	return out, nil
}

// Device describes device ordinal.
func (d *Driver) Device(ordinal int) (DeviceInfo, error) {
	var dev int32
	if r := d.api.cuDeviceGet(&dev, int32(ordinal)); r != Success {
		return DeviceInfo{}, d.err("cuDeviceGet", r)
	}
	info := DeviceInfo{Ordinal: ordinal, NUMANode: -1}
	var name [256]byte
	if r := d.api.cuDeviceGetName(&name[0], int32(len(name)), dev); r != Success {
		return DeviceInfo{}, d.err("cuDeviceGetName", r)
	}
	info.Name = cBytes(name[:])
	var total uint64
	if r := d.api.cuDeviceTotalMem(&total, dev); r != Success {
		return DeviceInfo{}, d.err("cuDeviceTotalMem_v2", r)
	}
	info.TotalMemory = int64(total)
	var bus [32]byte
	if r := d.api.cuDeviceGetPCIBusId(&bus[0], int32(len(bus)), dev); r == Success {
		info.PCIBusID = cBytes(bus[:])
	}
	if d.api.cuDeviceGetUuid != nil {
		var u [16]byte
		if r := d.api.cuDeviceGetUuid(&u, dev); r == Success {
			info.UUID = FormatUUID(u)
		}
	}
	attr := func(a int32) int {
		a, ok := d.dia.attr(a)
		if !ok {
			return -1 // the library has no such attribute
		}
		var v int32
		if d.api.cuDeviceGetAttribute(&v, a, dev) != Success {
			return -1
		}
		return int(v)
	}
	info.Compute = [2]int{attr(attrComputeMajor), attr(attrComputeMinor)}
	info.SMs = attr(attrMultiprocessorCount)
	info.VMM = d.vmm && attr(attrVMMSupported) == 1
	info.PosixFD = info.VMM && (d.dia.PosixFDWithVMM || attr(attrPosixFDSupported) == 1)
	info.Fabric = info.VMM && attr(attrFabricHandleSupported) == 1
	info.GPUDirectRDMA = attr(attrGPUDirectRDMA) == 1
	info.DMABuf = attr(attrDMABufSupported) == 1
	if v := attr(attrNUMAID); v >= 0 {
		info.NUMANode = v
	}
	n, err := d.DeviceCount()
	if err != nil {
		return DeviceInfo{}, err
	}
	for p := range n {
		if p == ordinal {
			continue
		}
		var can int32
		if r := d.api.cuDeviceCanAccessPeer(&can, dev, int32(p)); r == Success && can == 1 {
			info.Peers = append(info.Peers, p)
		}
	}
	return info, nil
}

// FormatUUID prints a CUuuid the way nvidia-smi and NVML do.
func FormatUUID(u [16]byte) string {
	return fmt.Sprintf("GPU-%x-%x-%x-%x-%x", u[0:4], u[4:6], u[6:8], u[8:10], u[10:16])
}

func cBytes(b []byte) string {
	for i, c := range b {
		if c == 0 {
			return string(b[:i])
		}
	}
	return string(b)
}
