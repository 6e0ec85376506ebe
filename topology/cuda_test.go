package topology

import (
	"reflect"
	"testing"
)

// The driver's devices merge into what the PCI scan found: matched by bus
// id (NVML's and sysfs's spellings alike) or UUID, real memory sizes win,
// and a device the scan missed is added.
func TestApplyCUDA(t *testing.T) {
	h := &Host{ID: "h", Devices: []Device{
		{Index: 0, Kind: KindGPU, Vendor: "nvidia", Model: "H200", MemoryBytes: 141e9, BusID: "0000:18:00.0"},
		{Index: 1, Kind: KindGPU, Vendor: "nvidia", Model: "unknown 10de:2335", BusID: "0000:2a:00.0", UUID: "GPU-b"},
		{Index: 4, Kind: KindNeuron, Vendor: "aws", BusID: "0000:99:00.0"},
	}}
	notes := ApplyCUDA(h, []CUDADevice{
		{Ordinal: 0, Name: "NVIDIA H200", UUID: "GPU-a", BusID: "00000000:18:00.0", MemoryBytes: 150754820096, NUMA: 0},
		{Ordinal: 1, Name: "NVIDIA H200", UUID: "GPU-b", BusID: "", MemoryBytes: 150754820096, NUMA: 0},
		{Ordinal: 2, Name: "NVIDIA H200", UUID: "GPU-c", BusID: "0000:3B:00.0", MemoryBytes: 150754820096, NUMA: -1},
	})
	want := []Device{
		{Index: 0, Kind: KindGPU, Vendor: "nvidia", Model: "H200", MemoryBytes: 150754820096, BusID: "0000:18:00.0", UUID: "GPU-a"},
		{Index: 1, Kind: KindGPU, Vendor: "nvidia", Model: "NVIDIA H200", MemoryBytes: 150754820096, BusID: "0000:2a:00.0", UUID: "GPU-b"},
		{Index: 4, Kind: KindNeuron, Vendor: "aws", BusID: "0000:99:00.0"},
		{Index: 5, Kind: KindGPU, Vendor: "nvidia", Model: "NVIDIA H200", MemoryBytes: 150754820096, BusID: "0000:3b:00.0", UUID: "GPU-c", Driver: "nvidia"},
	}
	if !reflect.DeepEqual(h.Devices, want) {
		t.Errorf("devices:\n got %+v\nwant %+v", h.Devices, want)
	}
	if len(notes) != 2 {
		t.Errorf("notes: %q", notes)
	}
	if err := (&Cluster{Hosts: []*Host{h}}).Validate(); err != nil {
		t.Error(err)
	}
	if n := ApplyCUDA(h, nil); n != nil || len(h.Devices) != 4 {
		t.Error("no devices changed something")
	}
}
