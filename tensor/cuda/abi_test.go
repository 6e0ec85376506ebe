package cuda

import (
	"testing"
	"unsafe"
)

// The layouts cuda.h documents for 64-bit Linux (CUDA 12): these structs
// cross into the driver by pointer, so sizes and offsets must match it
// byte for byte.
func TestABILayouts(t *testing.T) {
	var prop memAllocationProp
	var acc memAccessDesc
	for _, c := range []struct {
		name      string
		got, want uintptr
	}{
		{"sizeof(CUmemLocation)", unsafe.Sizeof(memLocation{}), 8},
		{"sizeof(CUmemAllocationProp)", unsafe.Sizeof(prop), 32},
		{"offsetof(CUmemAllocationProp.requestedHandleTypes)", unsafe.Offsetof(prop.RequestedHandleTypes), 4},
		{"offsetof(CUmemAllocationProp.location)", unsafe.Offsetof(prop.Location), 8},
		{"offsetof(CUmemAllocationProp.win32HandleMetaData)", unsafe.Offsetof(prop.Win32HandleMetaData), 16},
		{"offsetof(CUmemAllocationProp.allocFlags.compressionType)", unsafe.Offsetof(prop.CompressionType), 24},
		{"offsetof(CUmemAllocationProp.allocFlags.gpuDirectRDMACapable)", unsafe.Offsetof(prop.GPUDirectRDMACapable), 25},
		{"offsetof(CUmemAllocationProp.allocFlags.usage)", unsafe.Offsetof(prop.Usage), 26},
		{"offsetof(CUmemAllocationProp.allocFlags.reserved)", unsafe.Offsetof(prop.Reserved), 28},
		{"sizeof(CUmemAccessDesc)", unsafe.Sizeof(acc), 12},
		{"offsetof(CUmemAccessDesc.flags)", unsafe.Offsetof(acc.Flags), 8},
		{"sizeof(CUipcMemHandle)", unsafe.Sizeof(IPCMemHandle{}), 64},
		{"sizeof(CUmemFabricHandle)", unsafe.Sizeof(FabricHandle{}), 64},
	} {
		if c.got != c.want {
			t.Errorf("%s = %d, cuda.h says %d", c.name, c.got, c.want)
		}
	}
}

// Every entry point is bound under the name cuda.h's macros resolve to
// (the _v2 ABI where there is one): binding cuMemAlloc instead of
// cuMemAlloc_v2 would call the 32-bit-size ABI.
func TestSymbolTable(t *testing.T) {
	var a api
	seen := map[string]bool{}
	v2 := map[string]bool{
		"cuDeviceTotalMem_v2": true, "cuDevicePrimaryCtxRelease_v2": true, "cuMemGetInfo_v2": true,
		"cuMemAlloc_v2": true, "cuMemFree_v2": true, "cuIpcOpenMemHandle_v2": true,
		"cuStreamDestroy_v2": true, "cuEventDestroy_v2": true, "cuMemcpyHtoDAsync_v2": true,
		"cuMemcpyDtoHAsync_v2": true, "cuMemcpyDtoDAsync_v2": true, "cuDeviceGetUuid_v2": true,
	}
	for _, s := range a.symbols() {
		if seen[s.name] {
			t.Errorf("%s bound twice", s.name)
		}
		seen[s.name] = true
		delete(v2, s.name)
	}
	for name := range v2 {
		t.Errorf("%s is not bound under its versioned name", name)
	}
	if n := len(a.symbols()); n != 46 {
		t.Errorf("%d symbols; update this test when adding one", n)
	}
}
