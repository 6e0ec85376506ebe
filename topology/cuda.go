package topology

import (
	"fmt"
	"strings"
)

// CUDADevice is what the CUDA driver says of one GPU (tensor/cuda's
// DeviceInfo, reduced to what the model needs). topology does not load
// the driver itself: the caller that has it (the CLI, a runtime) passes
// the driver's devices to ApplyCUDA.
type CUDADevice struct {
	Ordinal     int
	Name        string // "NVIDIA H200"
	UUID        string // "GPU-..."
	BusID       string // "0000:18:00.0"
	MemoryBytes int64  // cuDeviceTotalMem: the real size
	NUMA        int    // -1 unknown
}

// ApplyCUDA merges the CUDA driver's devices into h. A GPU the PCI scan
// found (same bus id, else same UUID) takes the driver's memory size (what
// the device really has, not the model's marketed size), its UUID, and its
// name when the scan did not know the model. A GPU the scan missed (a
// container without /sys/bus/pci, a model the chip table lacks) is added
// with the driver's figures. It returns one note per change, for the
// discovery warnings.
func ApplyCUDA(h *Host, devs []CUDADevice) []string {
	var notes []string
	next := 0
	for _, d := range h.Devices {
		next = max(next, d.Index+1)
	}
	for _, c := range devs {
		i := matchCUDA(h, c)
		if i < 0 {
			numa := c.NUMA
			if numa < 0 {
				numa = 0
			}
			h.Devices = append(h.Devices, Device{Index: next, Kind: KindGPU, Vendor: "nvidia", Model: c.Name,
				MemoryBytes: c.MemoryBytes, NUMA: numa, BusID: normalBusID(c.BusID), UUID: c.UUID, Driver: "nvidia"})
			notes = append(notes, fmt.Sprintf("CUDA device %d (%s, %s) added from the driver: the PCI scan did not find it", c.Ordinal, c.Name, c.BusID))
			next++
			continue
		}
		d := &h.Devices[i]
		if c.MemoryBytes > 0 && d.MemoryBytes != c.MemoryBytes {
			if d.MemoryBytes != 0 {
				notes = append(notes, fmt.Sprintf("device %d: memory %d bytes from the CUDA driver (the model table said %d)", d.Index, c.MemoryBytes, d.MemoryBytes))
			}
			d.MemoryBytes = c.MemoryBytes
		}
		if c.UUID != "" {
			d.UUID = c.UUID
		}
		if c.Name != "" && (d.Model == "" || strings.HasPrefix(d.Model, "unknown")) {
			d.Model = c.Name
		}
	}
	return notes
}

func matchCUDA(h *Host, c CUDADevice) int {
	bus := normalBusID(c.BusID)
	for i, d := range h.Devices {
		if d.Kind == KindGPU && bus != "" && normalBusID(d.BusID) == bus {
			return i
		}
	}
	for i, d := range h.Devices {
		if d.Kind == KindGPU && c.UUID != "" && d.UUID == c.UUID {
			return i
		}
	}
	return -1
}
