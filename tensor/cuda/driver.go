package cuda

import (
	"fmt"
	"os"
	"runtime"
	"sync"
	"unsafe"

	"github.com/ebitengine/purego"
)

// DefaultLibrary is the driver library dlopen looks for. It ships with the
// NVIDIA driver (not the toolkit), so it is present on every GPU machine.
const DefaultLibrary = "libcuda.so.1"

// LibraryEnv names the environment variable that overrides DefaultLibrary
// (a driver outside the loader's path, or a test double).
const LibraryEnv = "TENSORLANE_LIBCUDA"

// Driver is a loaded, initialised CUDA driver library. One per library
// path per process (Load caches it): the driver itself is process-wide.
type Driver struct {
	dia     *API // which CUDA-shaped library this is
	path    string
	lib     uintptr
	version int
	api     api
	// vmm is true when the VMM entry points (cuMemCreate...) exist.
	vmm bool

	mu   sync.Mutex
	ctxs map[int]uintptr // retained primary contexts by ordinal
	peer map[[2]int]bool // peer access enabled (ctx of [0] reaches [1])
}

// api is the driver's function table, bound with purego (no cgo): each
// field is the C entry point of the same name (the _v2 ABI where one
// exists, as cuda.h's macros pick).
type api struct {
	cuInit                    func(flags uint32) Result
	cuDriverGetVersion        func(v *int32) Result
	cuGetErrorName            func(r Result, s *unsafe.Pointer) Result
	cuDeviceGetCount          func(n *int32) Result
	cuDeviceGet               func(d *int32, ordinal int32) Result
	cuDeviceGetName           func(name *byte, n int32, d int32) Result
	cuDeviceTotalMem          func(b *uint64, d int32) Result
	cuDeviceGetAttribute      func(v *int32, attr int32, d int32) Result
	cuDeviceGetPCIBusId       func(s *byte, n int32, d int32) Result
	cuDeviceGetUuid           func(u *[16]byte, d int32) Result
	cuDeviceCanAccessPeer     func(can *int32, d, peer int32) Result
	cuDevicePrimaryCtxRetain  func(ctx *uintptr, d int32) Result
	cuDevicePrimaryCtxRelease func(d int32) Result
	cuCtxSetCurrent           func(ctx uintptr) Result
	cuCtxEnablePeerAccess     func(peer uintptr, flags uint32) Result
	cuMemGetInfo              func(free, total *uint64) Result

	cuMemAlloc          func(p *uint64, n uint64) Result
	cuMemFree           func(p uint64) Result
	cuIpcGetMemHandle   func(h *IPCMemHandle, p uint64) Result
	cuIpcOpenMemHandle  func(p *uint64, h IPCMemHandle, flags uint32) Result
	cuIpcCloseMemHandle func(p uint64) Result
	cuMemHostAlloc      func(p *unsafe.Pointer, n uint64, flags uint32) Result
	cuMemFreeHost       func(p unsafe.Pointer) Result

	cuStreamCreate      func(s *uintptr, flags uint32) Result
	cuStreamDestroy     func(s uintptr) Result
	cuStreamSynchronize func(s uintptr) Result
	cuEventCreate       func(e *uintptr, flags uint32) Result
	cuEventDestroy      func(e uintptr) Result
	cuEventRecord       func(e, s uintptr) Result
	cuEventQuery        func(e uintptr) Result
	cuEventSynchronize  func(e uintptr) Result

	cuMemcpyHtoDAsync func(dst uint64, src unsafe.Pointer, n uint64, s uintptr) Result
	cuMemcpyDtoHAsync func(dst unsafe.Pointer, src uint64, n uint64, s uintptr) Result
	cuMemcpyDtoDAsync func(dst, src, n uint64, s uintptr) Result
	cuMemcpyPeerAsync func(dst uint64, dctx uintptr, src uint64, sctx uintptr, n uint64, s uintptr) Result
	cuMemcpy          func(dst, src, n uint64) Result

	// VMM (CUDA 10.2+); optional: without them allocations take the
	// legacy path.
	cuMemGetAllocationGranularity  func(g *uint64, prop *memAllocationProp, opt int32) Result
	cuMemCreate                    func(h *uint64, n uint64, prop *memAllocationProp, flags uint64) Result
	cuMemRelease                   func(h uint64) Result
	cuMemAddressReserve            func(p *uint64, n, align, addr, flags uint64) Result
	cuMemAddressFree               func(p, n uint64) Result
	cuMemMap                       func(p, n, off, h, flags uint64) Result
	cuMemUnmap                     func(p, n uint64) Result
	cuMemSetAccess                 func(p, n uint64, desc *memAccessDesc, count uint64) Result
	cuMemExportToShareableHandle   func(out unsafe.Pointer, h uint64, typ int32, flags uint64) Result
	cuMemImportFromShareableHandle func(h *uint64, osHandle uintptr, typ int32) Result
}

// symbol binds one entry point to its Go function variable.
type symbol struct {
	name     string
	fn       any // pointer to an api field
	optional bool
}

func (a *api) symbols() []symbol {
	return []symbol{
		{"cuInit", &a.cuInit, false},
		{"cuDriverGetVersion", &a.cuDriverGetVersion, false},
		{"cuGetErrorName", &a.cuGetErrorName, false},
		{"cuDeviceGetCount", &a.cuDeviceGetCount, false},
		{"cuDeviceGet", &a.cuDeviceGet, false},
		{"cuDeviceGetName", &a.cuDeviceGetName, false},
		{"cuDeviceTotalMem_v2", &a.cuDeviceTotalMem, false},
		{"cuDeviceGetAttribute", &a.cuDeviceGetAttribute, false},
		{"cuDeviceGetPCIBusId", &a.cuDeviceGetPCIBusId, false},
		{"cuDeviceGetUuid_v2", &a.cuDeviceGetUuid, true},
		{"cuDeviceCanAccessPeer", &a.cuDeviceCanAccessPeer, false},
		{"cuDevicePrimaryCtxRetain", &a.cuDevicePrimaryCtxRetain, false},
		{"cuDevicePrimaryCtxRelease_v2", &a.cuDevicePrimaryCtxRelease, false},
		{"cuCtxSetCurrent", &a.cuCtxSetCurrent, false},
		{"cuCtxEnablePeerAccess", &a.cuCtxEnablePeerAccess, false},
		{"cuMemGetInfo_v2", &a.cuMemGetInfo, false},
		{"cuMemAlloc_v2", &a.cuMemAlloc, false},
		{"cuMemFree_v2", &a.cuMemFree, false},
		{"cuIpcGetMemHandle", &a.cuIpcGetMemHandle, false},
		{"cuIpcOpenMemHandle_v2", &a.cuIpcOpenMemHandle, false},
		{"cuIpcCloseMemHandle", &a.cuIpcCloseMemHandle, false},
		{"cuMemHostAlloc", &a.cuMemHostAlloc, false},
		{"cuMemFreeHost", &a.cuMemFreeHost, false},
		{"cuStreamCreate", &a.cuStreamCreate, false},
		{"cuStreamDestroy_v2", &a.cuStreamDestroy, false},
		{"cuStreamSynchronize", &a.cuStreamSynchronize, false},
		{"cuEventCreate", &a.cuEventCreate, false},
		{"cuEventDestroy_v2", &a.cuEventDestroy, false},
		{"cuEventRecord", &a.cuEventRecord, false},
		{"cuEventQuery", &a.cuEventQuery, false},
		{"cuEventSynchronize", &a.cuEventSynchronize, false},
		{"cuMemcpyHtoDAsync_v2", &a.cuMemcpyHtoDAsync, false},
		{"cuMemcpyDtoHAsync_v2", &a.cuMemcpyDtoHAsync, false},
		{"cuMemcpyDtoDAsync_v2", &a.cuMemcpyDtoDAsync, false},
		{"cuMemcpyPeerAsync", &a.cuMemcpyPeerAsync, false},
		{"cuMemcpy", &a.cuMemcpy, false},
		{"cuMemGetAllocationGranularity", &a.cuMemGetAllocationGranularity, true},
		{"cuMemCreate", &a.cuMemCreate, true},
		{"cuMemRelease", &a.cuMemRelease, true},
		{"cuMemAddressReserve", &a.cuMemAddressReserve, true},
		{"cuMemAddressFree", &a.cuMemAddressFree, true},
		{"cuMemMap", &a.cuMemMap, true},
		{"cuMemUnmap", &a.cuMemUnmap, true},
		{"cuMemSetAccess", &a.cuMemSetAccess, true},
		{"cuMemExportToShareableHandle", &a.cuMemExportToShareableHandle, true},
		{"cuMemImportFromShareableHandle", &a.cuMemImportFromShareableHandle, true},
	}
}

var (
	loadMu  sync.Mutex
	drivers = map[string]*Driver{}
)

// LibraryPath returns the library Load("") opens: $TENSORLANE_LIBCUDA, or
// DefaultLibrary.
func LibraryPath() string { return CUDA.LibraryPath() }

// LibraryPath returns the library LoadAPI(a, "") opens: $LibraryEnv, or
// Library.
func (a *API) LibraryPath() string {
	if a.LibraryEnv != "" {
		if p := os.Getenv(a.LibraryEnv); p != "" {
			return p
		}
	}
	return a.Library
}

// Load opens the CUDA driver library at path ("" means LibraryPath()),
// binds its entry points and initialises it (cuInit). It never needs cgo
// or the CUDA toolkit. On a machine without a usable driver it returns an
// *UnavailableError (errors.Is ErrUnavailable) saying why: the loader's
// message, the missing entry point, or the driver's answer to cuInit.
// A loaded driver is cached per path; a failure is not, so a later call
// tries again.
func Load(path string) (*Driver, error) { return LoadAPI(CUDA, path) }

// LoadAPI is Load for another CUDA-shaped driver library (see API); path ""
// means a.LibraryPath().
func LoadAPI(a *API, path string) (*Driver, error) {
	if a == nil {
		a = CUDA
	}
	if path == "" {
		path = a.LibraryPath()
	}
	loadMu.Lock()
	defer loadMu.Unlock()
	key := a.name() + "\x00" + path
	if d := drivers[key]; d != nil {
		return d, nil
	}
	lib, err := purego.Dlopen(path, purego.RTLD_NOW|purego.RTLD_LOCAL)
	if err != nil {
		return nil, &UnavailableError{API: a, Library: path, Reason: "dlopen: " + err.Error()}
	}
	d := &Driver{dia: a, path: path, lib: lib, ctxs: map[int]uintptr{}, peer: map[[2]int]bool{}}
	if err := d.bind(); err != nil {
		purego.Dlclose(lib)
		return nil, err
	}
	if r := d.api.cuInit(0); r != Success {
		err := d.err("cuInit", r)
		purego.Dlclose(lib)
		return nil, &UnavailableError{API: a, Library: path, Reason: err.Error(), Err: err}
	}
	var v int32
	if r := d.api.cuDriverGetVersion(&v); r == Success {
		d.version = int(v)
	}
	drivers[key] = d
	return d, nil
}

// bind looks up every entry point; a required one missing makes the
// library unusable (a stub or a driver too old), an optional one turns a
// feature off.
func (d *Driver) bind() (err error) {
	// purego panics on a Go signature it cannot call; that is our bug, but
	// it must not take the process down on a machine that merely has a GPU.
	defer func() {
		if r := recover(); r != nil {
			err = &UnavailableError{API: d.dia, Library: d.path, Reason: fmt.Sprint("binding entry points: ", r)}
		}
	}()
	vmm := true
	for _, s := range d.api.symbols() {
		name := d.dia.symbol(s.name)
		sym, serr := purego.Dlsym(d.lib, name)
		if serr != nil || sym == 0 {
			if s.optional {
				if s.name != "cuDeviceGetUuid_v2" {
					vmm = false
				}
				continue
			}
			return &UnavailableError{API: d.dia, Library: d.path, Reason: "entry point " + name + " missing (driver too old, or not a " + d.dia.name() + " driver)"}
		}
		if !d.bindAdapted(s.name, sym) {
			purego.RegisterFunc(s.fn, sym)
		}
	}
	d.vmm = vmm
	return nil
}

// API returns the driver's API (CUDA, or another CUDA-shaped library).
func (d *Driver) API() *API { return d.dia }

// Path returns the library the driver was loaded from.
func (d *Driver) Path() string { return d.path }

// Version returns the driver's CUDA version (12080 for 12.8).
func (d *Driver) Version() int { return d.version }

// VMM reports whether the driver has the virtual memory management API.
func (d *Driver) VMM() bool { return d.vmm }

// err turns a failed result into an *Error with the driver's name for it.
func (d *Driver) err(op string, r Result) error {
	if r == Success {
		return nil
	}
	e := &Error{Op: d.dia.symbol(op), Code: r, api: d.dia}
	var p unsafe.Pointer
	if d.api.cuGetErrorName != nil && d.api.cuGetErrorName(r, &p) == Success && p != nil {
		e.Name = cString(p, 128)
	}
	return e
}

// cString copies a NUL-terminated C string of at most max bytes.
func cString(p unsafe.Pointer, max int) string {
	for i := range max {
		if *(*byte)(unsafe.Add(p, i)) == 0 {
			return string(unsafe.Slice((*byte)(p), i))
		}
	}
	return string(unsafe.Slice((*byte)(p), max))
}

// context returns the primary context of device ordinal, retaining it the
// first time (primary contexts are shared with every other CUDA user of the
// process, as the runtime API shares them).
func (d *Driver) context(ordinal int) (uintptr, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if c, ok := d.ctxs[ordinal]; ok {
		return c, nil
	}
	var dev int32
	if r := d.api.cuDeviceGet(&dev, int32(ordinal)); r != Success {
		return 0, d.err("cuDeviceGet", r)
	}
	var c uintptr
	if r := d.api.cuDevicePrimaryCtxRetain(&c, dev); r != Success {
		return 0, d.err("cuDevicePrimaryCtxRetain", r)
	}
	d.ctxs[ordinal] = c
	return c, nil
}

// on runs f with ctx current on a locked OS thread: a CUDA context is
// per thread, and goroutines move between threads.
func (d *Driver) on(ctx uintptr, f func() error) error {
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	if r := d.api.cuCtxSetCurrent(ctx); r != Success {
		return d.err("cuCtxSetCurrent", r)
	}
	return f()
}
