package cuda

// The driver API's types and constants this package uses, with the values
// and layouts of cuda.h (CUDA 12). The struct layouts are checked against
// the header's documented sizes and offsets in abi_test.go: they cross the
// C boundary by pointer, so one wrong field shifts every field after it.

// Result is a CUresult.
type Result int32

// The CUresult values this package tells apart.
const (
	Success                  Result = 0
	ErrorInvalidValue        Result = 1
	ErrorOutOfMemory         Result = 2
	ErrorNotInitialized      Result = 3
	ErrorDeinitialized       Result = 4
	ErrorStubLibrary         Result = 34
	ErrorDeviceUnavailable   Result = 46
	ErrorNoDevice            Result = 100
	ErrorInvalidDevice       Result = 101
	ErrorInvalidContext      Result = 201
	ErrorAlreadyMapped       Result = 208
	ErrorPeerAccessUnsupport Result = 217
	ErrorOperatingSystem     Result = 304
	ErrorInvalidHandle       Result = 400
	ErrorNotFound            Result = 500
	ErrorNotReady            Result = 600
	ErrorIllegalAddress      Result = 700
	ErrorPeerAccessEnabled   Result = 704
	ErrorNotPermitted        Result = 800
	ErrorNotSupported        Result = 801
	ErrorSystemNotReady      Result = 802
	ErrorDriverMismatch      Result = 803
	ErrorCompatNotSupported  Result = 804
	ErrorUnknown             Result = 999
)

// CUdevice_attribute values.
const (
	attrMultiprocessorCount   = 16
	attrPCIBusID              = 33
	attrPCIDeviceID           = 34
	attrUnifiedAddressing     = 41
	attrPCIDomainID           = 50
	attrComputeMajor          = 75
	attrComputeMinor          = 76
	attrVMMSupported          = 102
	attrPosixFDSupported      = 103
	attrGPUDirectRDMA         = 116
	attrDMABufSupported       = 124
	attrFabricHandleSupported = 128
	attrNUMAID                = 131
)

// CUmemAllocationHandleType bits.
const (
	handlePosixFD = 0x1
	handleFabric  = 0x8
)

const (
	memAllocationTypePinned = 1 // CU_MEM_ALLOCATION_TYPE_PINNED
	memLocationTypeDevice   = 1 // CU_MEM_LOCATION_TYPE_DEVICE
	memAccessRead           = 1 // CU_MEM_ACCESS_FLAGS_PROT_READ
	memAccessReadWrite      = 3 // CU_MEM_ACCESS_FLAGS_PROT_READWRITE
	granularityMinimum      = 0 // CU_MEM_ALLOC_GRANULARITY_MINIMUM
	streamNonBlocking       = 1 // CU_STREAM_NON_BLOCKING
	eventDisableTiming      = 2 // CU_EVENT_DISABLE_TIMING
	memHostAllocPortable    = 1 // CU_MEMHOSTALLOC_PORTABLE
	ipcLazyEnablePeerAccess = 1 // CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS
)

// memLocation is CUmemLocation: { CUmemLocationType type; int id; }.
type memLocation struct {
	Type int32
	ID   int32
}

// memAllocationProp is CUmemAllocationProp (32 bytes on 64-bit Linux).
type memAllocationProp struct {
	Type                 int32
	RequestedHandleTypes int32
	Location             memLocation
	Win32HandleMetaData  uintptr
	// allocFlags: compressionType, gpuDirectRDMACapable, usage, reserved[4].
	CompressionType      uint8
	GPUDirectRDMACapable uint8
	Usage                uint16
	Reserved             [4]uint8
}

// memAccessDesc is CUmemAccessDesc: { CUmemLocation location; CUmemAccess_flags flags; }.
type memAccessDesc struct {
	Location memLocation
	Flags    int32
}

// IPCMemHandle is CUipcMemHandle: 64 opaque bytes naming a cuMemAlloc
// allocation to other processes.
type IPCMemHandle struct{ Reserved [64]byte }

// FabricHandle is CUmemFabricHandle: 64 opaque bytes naming a VMM
// allocation across the nodes of an NVLink fabric (GB200 NVL72, IMEX).
type FabricHandle struct{ Data [64]byte }
