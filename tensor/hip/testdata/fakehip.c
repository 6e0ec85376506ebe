// fakehip.c: a test double of AMD's HIP runtime (libamdhip64.so) for the
// entry points tensor/hip calls. HIP's driver-style entry points take the
// same arguments as the CUDA driver's, so this file renames the fake CUDA
// driver's (tensor/cuda/testdata/fakecuda.c, included below) to HIP's names
// and adds the few HIP differs in: hipGetErrorName returns the name,
// hipMemcpyPeerAsync takes device ordinals instead of contexts, and
// hipDeviceGetAttribute numbers attributes its own way (and has none for
// POSIX-fd handles, fabric handles, GPUDirect RDMA or NUMA). "Device memory"
// is host memory, as in the CUDA fake: it keeps the Go side honest and
// says nothing about a GPU.
// Build: gcc -shared -fPIC -I../../cuda/testdata -o libamdhip64.so fakehip.c
#define cuInit hipInit
#define cuDriverGetVersion hipDriverGetVersion
#define cuGetErrorName fakehip_cu_error_name
#define cuGetErrorString fakehip_cu_error_string
#define cuDeviceGetCount hipGetDeviceCount
#define cuDeviceGet hipDeviceGet
#define cuDeviceGetName hipDeviceGetName
#define cuDeviceTotalMem_v2 hipDeviceTotalMem
#define cuDeviceGetAttribute fakehip_cu_attribute
#define cuDeviceGetPCIBusId hipDeviceGetPCIBusId
#define cuDeviceGetUuid_v2 hipDeviceGetUuid
#define cuDeviceCanAccessPeer hipDeviceCanAccessPeer
#define cuDevicePrimaryCtxRetain hipDevicePrimaryCtxRetain
#define cuDevicePrimaryCtxRelease_v2 hipDevicePrimaryCtxRelease
#define cuCtxSetCurrent hipCtxSetCurrent
#define cuCtxEnablePeerAccess hipCtxEnablePeerAccess
#define cuMemGetInfo_v2 hipMemGetInfo
#define cuMemGetAllocationGranularity hipMemGetAllocationGranularity
#define cuMemCreate hipMemCreate
#define cuMemRelease hipMemRelease
#define cuMemAddressReserve hipMemAddressReserve
#define cuMemAddressFree hipMemAddressFree
#define cuMemMap hipMemMap
#define cuMemUnmap hipMemUnmap
#define cuMemSetAccess hipMemSetAccess
#define cuMemExportToShareableHandle hipMemExportToShareableHandle
#define cuMemImportFromShareableHandle hipMemImportFromShareableHandle
#define cuMemAlloc_v2 hipMalloc
#define cuMemFree_v2 hipFree
#define cuIpcGetMemHandle hipIpcGetMemHandle
#define cuIpcOpenMemHandle_v2 hipIpcOpenMemHandle
#define cuIpcCloseMemHandle hipIpcCloseMemHandle
#define cuMemHostAlloc hipHostMalloc
#define cuMemFreeHost hipHostFree
#define cuStreamCreate hipStreamCreateWithFlags
#define cuStreamDestroy_v2 hipStreamDestroy
#define cuStreamSynchronize hipStreamSynchronize
#define cuEventCreate hipEventCreateWithFlags
#define cuEventDestroy_v2 hipEventDestroy
#define cuEventRecord hipEventRecord
#define cuEventQuery hipEventQuery
#define cuEventSynchronize hipEventSynchronize
#define cuMemcpyHtoDAsync_v2 hipMemcpyHtoDAsync
#define cuMemcpyDtoHAsync_v2 hipMemcpyDtoHAsync
#define cuMemcpyDtoDAsync_v2 hipMemcpyDtoDAsync
#define cuMemcpyPeerAsync fakehip_cu_peer
#define cuMemcpy hipMemcpyDtoD
#define fakecuda_set fakehip_set
#define fakecuda_live fakehip_live
#include "fakecuda.c"

static const char *hipnames[][2] = {
	{"hipSuccess", "no error"}, {"hipErrorInvalidValue", "invalid argument"},
	{"hipErrorOutOfMemory", "out of memory"}, {"hipErrorNotInitialized", "initialization error"},
	{"hipErrorNoDevice", "no ROCm-capable device is detected"},
	{"hipErrorNotSupported", "operation not supported"},
};
const char *hipGetErrorName(int r) { int i = nameidx(r); return i < 0 ? "hipErrorUnknown" : hipnames[i][0]; }
const char *hipGetErrorString(int r) { int i = nameidx(r); return i < 0 ? "unknown error" : hipnames[i][1]; }

// hipDeviceGetAttribute: HIP's numbering (hip_runtime_api.h), answered with
// what the CUDA fake says of the same attribute.
int hipDeviceGetAttribute(int *v, int attr, int d) {
	int cu;
	switch (attr) {
	case 63: cu = 16; break;  // hipDeviceAttributeMultiprocessorCount
	case 67: cu = 33; break;  // hipDeviceAttributePciBusId
	case 68: cu = 34; break;  // hipDeviceAttributePciDeviceId
	case 69: cu = 50; break;  // hipDeviceAttributePciDomainID
	case 85: cu = 41; break;  // hipDeviceAttributeUnifiedAddressing
	case 23: cu = 75; break;  // hipDeviceAttributeComputeCapabilityMajor
	case 61: cu = 76; break;  // hipDeviceAttributeComputeCapabilityMinor
	case 89: cu = 102; break; // hipDeviceAttributeVirtualMemoryManagementSupported
	default: NEED_INIT(); if (d < 0 || d >= ndev) return INVALID_DEVICE; *v = 0; return OK;
	}
	return fakehip_cu_attribute(v, cu, d);
}

// hipMemcpyPeerAsync takes device ordinals; the CUDA fake's contexts are
// ordinal+1.
int hipMemcpyPeerAsync(CUdeviceptr dst, int ddev, CUdeviceptr src, int sdev, size_t n, CUstream st) {
	if (ddev < 0 || ddev >= ndev || sdev < 0 || sdev >= ndev) return INVALID_DEVICE;
	return fakehip_cu_peer(dst, (CUcontext)(uintptr_t)(ddev + 1), src, (CUcontext)(uintptr_t)(sdev + 1), n, st);
}
