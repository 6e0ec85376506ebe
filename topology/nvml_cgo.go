//go:build linux && cgo && nvml

package topology

import (
	"encoding/hex"
	"fmt"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
)

// liveNVML reads the GPUs through libnvidia-ml, loaded at run time: a
// machine without the library gets errNVMLUnavailable, not a link error.
func liveNVML() ([]nvmlGPU, error) {
	if ret := nvml.Init(); ret != nvml.SUCCESS {
		return nil, fmt.Errorf("%w: %s", errNVMLUnavailable, nvml.ErrorString(ret))
	}
	defer nvml.Shutdown()
	n, ret := nvml.DeviceGetCount()
	if ret != nvml.SUCCESS {
		return nil, fmt.Errorf("NVML device count: %s", nvml.ErrorString(ret))
	}
	var out []nvmlGPU
	for i := range n {
		dev, ret := nvml.DeviceGetHandleByIndex(i)
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML device %d: %s", i, nvml.ErrorString(ret))
		}
		pci, ret := dev.GetPciInfo()
		if ret != nvml.SUCCESS {
			return nil, fmt.Errorf("NVML device %d PCI info: %s", i, nvml.ErrorString(ret))
		}
		g := nvmlGPU{BusID: cString(pci.BusId[:])}
		if uuid, ret := dev.GetUUID(); ret == nvml.SUCCESS {
			g.UUID = uuid
		}
		for link := range nvml.NVLINK_MAX_LINKS {
			state, ret := dev.GetNvLinkState(link)
			if ret != nvml.SUCCESS {
				break // past the device's last link (or no NVLink at all)
			}
			if state != nvml.FEATURE_ENABLED {
				continue
			}
			remote, ret := dev.GetNvLinkRemotePciInfo(link)
			if ret != nvml.SUCCESS {
				continue
			}
			kind, ret := dev.GetNvLinkRemoteDeviceType(link)
			g.Links = append(g.Links, nvmlLink{
				RemoteBusID: cString(remote.BusId[:]),
				ToSwitch:    ret == nvml.SUCCESS && kind == nvml.NVLINK_DEVICE_TYPE_SWITCH,
			})
		}
		if fi, ret := dev.GetGpuFabricInfo(); ret == nvml.SUCCESS && fi.State == nvml.GPU_FABRIC_STATE_COMPLETED && fi.ClusterUuid != [16]uint8{} {
			g.Fabric = nvmlFabric{Cluster: hex.EncodeToString(fi.ClusterUuid[:]), Clique: fi.CliqueId}
		}
		out = append(out, g)
	}
	return out, nil
}

func cString(b []int8) string {
	out := make([]byte, 0, len(b))
	for _, c := range b {
		if c == 0 {
			break
		}
		out = append(out, byte(c))
	}
	return string(out)
}
