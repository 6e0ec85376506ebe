package envinfo

import (
	"fmt"

	"github.com/tensorlane/tensorlane/tensor/cuda"
	"github.com/tensorlane/tensorlane/topology"
	"github.com/tensorlane/tensorlane/topology/render"
)

// CUDAReport is what the CUDA driver API (tensor/cuda, loaded at run time
// without cgo) says on this machine: its devices, or why it cannot be used.
type CUDAReport struct {
	Library     string   `json:"library"`
	Version     string   `json:"version,omitempty"` // "12.8"
	Devices     []string `json:"devices,omitempty"` // "0: NVIDIA H200, 141 GiB, VMM+fd, peers [1 2]"
	Unavailable string   `json:"unavailable,omitempty"`

	topo []topology.CUDADevice
}

// ProbeCUDA loads the driver ($TENSORLANE_LIBCUDA or libcuda.so.1).
func ProbeCUDA() CUDAReport {
	r := CUDAReport{Library: cuda.LibraryPath()}
	d, err := cuda.Load("")
	if err == nil {
		var devs []cuda.DeviceInfo
		if devs, err = d.Devices(); err == nil {
			r.Version = fmt.Sprintf("%d.%d", d.Version()/1000, d.Version()%1000/10)
			for _, i := range devs {
				feat := "legacy IPC"
				if i.VMM && i.PosixFD {
					feat = "VMM+fd"
					if i.Fabric {
						feat += "+fabric"
					}
				}
				r.Devices = append(r.Devices, fmt.Sprintf("%d: %s, %s, %s, peers %v", i.Ordinal, i.Name, render.MemorySize(i.TotalMemory), feat, i.Peers))
				r.topo = append(r.topo, topology.CUDADevice{Ordinal: i.Ordinal, Name: i.Name, UUID: i.UUID, BusID: i.PCIBusID,
					MemoryBytes: i.TotalMemory, NUMA: i.NUMANode})
			}
			return r
		}
	}
	r.Unavailable = err.Error()
	return r
}

// ApplyCUDA merges the driver's GPUs into a live discovery and records the
// driver as one more plugin run (with why it was not usable).
func ApplyCUDA(d *topology.Discovery, r CUDAReport) {
	run := topology.PluginRun{Name: "cuda-driver", Maturity: topology.Beta, Err: r.Unavailable}
	before := len(d.Host.Devices)
	for _, n := range topology.ApplyCUDA(d.Host, r.topo) {
		d.Warnings = append(d.Warnings, topology.Warning{Plugin: "cuda-driver", Msg: n})
	}
	run.Devices = len(d.Host.Devices) - before
	d.Plugins = append(d.Plugins, run)
}
