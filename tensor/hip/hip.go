// Package hip is real AMD GPU memory as a tensor.Memory, through the HIP
// runtime (libamdhip64.so, shipped with ROCm) loaded at run time with
// purego: no cgo and no ROCm at build time, so every build compiles and
// runs on machines without an AMD GPU, where Load and NewMemory return an
// error matching ErrUnavailable that says why.
//
// HIP's driver-style entry points (hipDevicePrimaryCtxRetain, hipMemCreate,
// hipMemExportToShareableHandle, hipMemcpyDtoDAsync, hipIpcGetMemHandle,
// streams and events) take the same arguments as the CUDA driver API's and
// answer with the same result codes, so this package is tensor/cuda's
// engine driven through HIP's names (a cuda.API): VMM allocations with one
// POSIX fd per allocation (tensor.HandleHIPFD), hipMalloc with 64-byte IPC
// handles where VMM is missing (tensor.HandleHIPIPC), host copies through
// pinned staging (hipHostMalloc) on streams, device and peer copies
// (hipMemcpyPeerAsync over xGMI or PCIe), every copy complete when its
// event says so, typed errors. Memory, Buffer and Config are tensor/cuda's
// types; their errors name HIP's entry points.
//
// The tests run everywhere on a fake libamdhip64 (package hiptest, built
// with gcc from testdata/fakehip.c over the fake CUDA driver). Nobody has
// run this package on an AMD GPU yet: docs/accelerators.md says what is
// verified.
package hip

import (
	"errors"
	"os"
	"path/filepath"

	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
)

// DefaultLibrary is the HIP runtime library dlopen looks for when ROCm's
// own copy ($ROCM_PATH/lib, default /opt/rocm/lib) is not there.
const DefaultLibrary = "libamdhip64.so"

// LibraryEnv names the environment variable that overrides the library
// (a ROCm outside the usual places, or a test double).
const LibraryEnv = "TENSORLANE_LIBHIP"

// ErrUnavailable matches every error that says HIP cannot be used in this
// process: no library, a library without the entry points we need, no
// device, a runtime that refuses to initialise. It is matched by the same
// errors as cuda.ErrUnavailable (errors.Is with either is true).
var ErrUnavailable = errors.New("hip: unavailable")

// Errors shared with tensor/cuda's engine.
var (
	ErrNotSupported = cuda.ErrNotSupported
	ErrCopyTimeout  = cuda.ErrCopyTimeout
	ErrReadOnly     = cuda.ErrReadOnly
)

// Memory, Buffer, Config, Mode and DeviceInfo are tensor/cuda's: the same
// engine over HIP's entry points.
type (
	Memory     = cuda.Memory
	Buffer     = cuda.Buffer
	Config     = cuda.Config
	Mode       = cuda.Mode
	DeviceInfo = cuda.DeviceInfo
	Driver     = cuda.Driver
	// UnavailableError says which library was tried and why it is unusable.
	UnavailableError = cuda.UnavailableError
)

// Allocation modes (see cuda.Mode).
const (
	ModeAuto   = cuda.ModeAuto
	ModeVMM    = cuda.ModeVMM
	ModeLegacy = cuda.ModeLegacy
)

// API is HIP as a CUDA-shaped driver API: its library, its entry point
// names, its device attribute numbers (hip_runtime_api.h's
// hipDeviceAttribute_t), and its handle kinds.
var API = &cuda.API{
	Name:    "hip",
	Library: DefaultLibrary, LibraryEnv: LibraryEnv,
	Symbols: map[string]string{
		"cuInit":                         "hipInit",
		"cuDriverGetVersion":             "hipDriverGetVersion",
		"cuGetErrorName":                 "hipGetErrorName",
		"cuDeviceGetCount":               "hipGetDeviceCount",
		"cuDeviceGet":                    "hipDeviceGet",
		"cuDeviceGetName":                "hipDeviceGetName",
		"cuDeviceTotalMem_v2":            "hipDeviceTotalMem",
		"cuDeviceGetAttribute":           "hipDeviceGetAttribute",
		"cuDeviceGetPCIBusId":            "hipDeviceGetPCIBusId",
		"cuDeviceGetUuid_v2":             "hipDeviceGetUuid",
		"cuDeviceCanAccessPeer":          "hipDeviceCanAccessPeer",
		"cuDevicePrimaryCtxRetain":       "hipDevicePrimaryCtxRetain",
		"cuDevicePrimaryCtxRelease_v2":   "hipDevicePrimaryCtxRelease",
		"cuCtxSetCurrent":                "hipCtxSetCurrent",
		"cuCtxEnablePeerAccess":          "hipCtxEnablePeerAccess",
		"cuMemGetInfo_v2":                "hipMemGetInfo",
		"cuMemAlloc_v2":                  "hipMalloc",
		"cuMemFree_v2":                   "hipFree",
		"cuIpcGetMemHandle":              "hipIpcGetMemHandle",
		"cuIpcOpenMemHandle_v2":          "hipIpcOpenMemHandle",
		"cuIpcCloseMemHandle":            "hipIpcCloseMemHandle",
		"cuMemHostAlloc":                 "hipHostMalloc",
		"cuMemFreeHost":                  "hipHostFree",
		"cuStreamCreate":                 "hipStreamCreateWithFlags",
		"cuStreamDestroy_v2":             "hipStreamDestroy",
		"cuStreamSynchronize":            "hipStreamSynchronize",
		"cuEventCreate":                  "hipEventCreateWithFlags",
		"cuEventDestroy_v2":              "hipEventDestroy",
		"cuEventRecord":                  "hipEventRecord",
		"cuEventQuery":                   "hipEventQuery",
		"cuEventSynchronize":             "hipEventSynchronize",
		"cuMemcpyHtoDAsync_v2":           "hipMemcpyHtoDAsync",
		"cuMemcpyDtoHAsync_v2":           "hipMemcpyDtoHAsync",
		"cuMemcpyDtoDAsync_v2":           "hipMemcpyDtoDAsync",
		"cuMemcpyPeerAsync":              "hipMemcpyPeerAsync",
		"cuMemcpy":                       "hipMemcpyDtoD",
		"cuMemGetAllocationGranularity":  "hipMemGetAllocationGranularity",
		"cuMemCreate":                    "hipMemCreate",
		"cuMemRelease":                   "hipMemRelease",
		"cuMemAddressReserve":            "hipMemAddressReserve",
		"cuMemAddressFree":               "hipMemAddressFree",
		"cuMemMap":                       "hipMemMap",
		"cuMemUnmap":                     "hipMemUnmap",
		"cuMemSetAccess":                 "hipMemSetAccess",
		"cuMemExportToShareableHandle":   "hipMemExportToShareableHandle",
		"cuMemImportFromShareableHandle": "hipMemImportFromShareableHandle",
	},
	// CUdevice_attribute -> hipDeviceAttribute_t. HIP has no attribute for
	// POSIX-fd handles (every VMM device on Linux has them), fabric
	// handles, GPUDirect RDMA or the NUMA node: those read as absent.
	Attributes: map[int32]int32{
		16:  63, // multiprocessor count
		33:  67, // PCI bus
		34:  68, // PCI device
		50:  69, // PCI domain
		41:  85, // unified addressing
		75:  23, // compute capability major
		76:  61, // compute capability minor
		102: 89, // virtual memory management supported
	},
	PosixFDWithVMM:    true,
	PeerCopyByOrdinal: true,
	ErrorNameReturns:  true,
	HandleFD:          tensor.HandleHIPFD,
	HandleIPC:         tensor.HandleHIPIPC,
	Unavailable:       ErrUnavailable,
}

// LibraryPath returns the library Load("") opens: $TENSORLANE_LIBHIP;
// else ROCm's own copy, $ROCM_PATH/lib/libamdhip64.so (ROCM_PATH defaults
// to /opt/rocm), when it exists; else DefaultLibrary, found the way dlopen
// finds libraries.
func LibraryPath() string {
	if p := os.Getenv(LibraryEnv); p != "" {
		return p
	}
	root := os.Getenv("ROCM_PATH")
	if root == "" {
		root = "/opt/rocm"
	}
	if p := filepath.Join(root, "lib", DefaultLibrary); fileExists(p) {
		return p
	}
	return DefaultLibrary
}

func fileExists(p string) bool {
	st, err := os.Stat(p)
	return err == nil && !st.IsDir()
}

// Load opens the HIP runtime at path ("" means LibraryPath()), binds its
// entry points and initialises it (hipInit). Without a usable runtime it
// returns an *UnavailableError (errors.Is ErrUnavailable) saying why.
func Load(path string) (*Driver, error) {
	if path == "" {
		path = LibraryPath()
	}
	return cuda.LoadAPI(API, path)
}

// NewMemory opens device cfg.Device (a HIP ordinal, as HIP_VISIBLE_DEVICES
// numbers them) of the runtime at cfg.Library ("" means LibraryPath()).
// cfg.API is set to API whatever it was. The process's importer of HIP
// handles becomes this memory's unless one is registered already.
func NewMemory(cfg Config) (*Memory, error) {
	cfg.API = API
	if cfg.Library == "" {
		cfg.Library = LibraryPath()
	}
	return cuda.NewMemory(cfg)
}
