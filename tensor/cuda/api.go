package cuda

import (
	"errors"
	"unsafe"

	"github.com/ebitengine/purego"

	"github.com/tensorlane/tensorlane/tensor"
)

// API describes a driver library with the shape of CUDA's driver API:
// CUDA itself, or AMD's HIP, whose driver-style entry points
// (hipDevicePrimaryCtxRetain, hipMemCreate, hipMemcpyDtoDAsync, ...) take
// the same arguments with the same layouts and answer with the same
// result codes. This package's allocation, sharing, staging and copy code
// runs unchanged over any such library; an API says only where the library
// is, what its entry points and device attributes are called, and which
// handle kinds its allocations travel as. tensor/hip is the HIP one; a
// back-end for another CUDA-shaped driver adds its own.
//
// An API is a process-wide constant: pass a pointer to one package-level
// value (drivers are cached per API and library path).
type API struct {
	// Name is the API's short name in errors and logs: "cuda", "hip".
	Name string
	// Library is the library dlopen opens by default, and LibraryEnv the
	// environment variable that overrides it.
	Library, LibraryEnv string
	// Symbols maps this package's entry point names (cuda.h's, with the
	// _v2 suffixes cuda.h's macros pick) to the library's; a name missing
	// from the map is looked up as it is.
	Symbols map[string]string
	// Attributes maps the CUdevice_attribute values this package asks for
	// to the library's numbering; nil asks with CUDA's numbers, and an
	// attribute missing from a non-nil map is not asked (reads as absent).
	Attributes map[int32]int32
	// PosixFDWithVMM: the library has no attribute for POSIX-fd shareable
	// handles, and every device with the VMM API has them (HIP on Linux).
	PosixFDWithVMM bool
	// PeerCopyByOrdinal: the peer copy entry point takes device ordinals
	// where cuMemcpyPeerAsync takes contexts (hipMemcpyPeerAsync).
	PeerCopyByOrdinal bool
	// ErrorNameReturns: the error-name entry point returns the name where
	// cuGetErrorName writes it through a pointer (hipGetErrorName).
	ErrorNameReturns bool
	// HandleFD and HandleIPC are the kinds of an exported VMM allocation
	// (a POSIX fd) and of a legacy IPC handle of this API: an importer of
	// one API never takes another's.
	HandleFD, HandleIPC tensor.HandleKind
	// Unavailable is the API's own sentinel for an unusable library; its
	// *UnavailableError matches it and ErrUnavailable.
	Unavailable error
}

// CUDA is NVIDIA's driver API, libcuda.so.1: what Load, NewMemory and a
// zero Config use.
var CUDA = &API{
	Name: "cuda", Library: DefaultLibrary, LibraryEnv: LibraryEnv,
	HandleFD: tensor.HandleCUDAFD, HandleIPC: tensor.HandleCUDAIPC,
}

func (a *API) name() string {
	if a == nil || a.Name == "" {
		return "cuda"
	}
	return a.Name
}

// symbol is the library's name for one of this package's entry points.
func (a *API) symbol(name string) string {
	if s, ok := a.Symbols[name]; ok {
		return s
	}
	return name
}

// attr is the library's number for a CUDA device attribute, or false when
// it has none.
func (a *API) attr(cu int32) (int32, bool) {
	if a.Attributes == nil {
		return cu, true
	}
	v, ok := a.Attributes[cu]
	return v, ok
}

// bindAdapted binds the entry points whose signature differs from
// cuda.h's (see API) and wraps them in functions of this package's
// signatures; it reports whether it bound the symbol itself.
func (d *Driver) bindAdapted(name string, sym uintptr) bool {
	switch {
	case name == "cuMemcpyPeerAsync" && d.dia.PeerCopyByOrdinal:
		var f func(dst uint64, ddev int32, src uint64, sdev int32, n uint64, s uintptr) Result
		purego.RegisterFunc(&f, sym)
		d.api.cuMemcpyPeerAsync = func(dst uint64, dctx uintptr, src uint64, sctx uintptr, n uint64, s uintptr) Result {
			dd, sd := d.ordinalOf(dctx), d.ordinalOf(sctx)
			if dd < 0 || sd < 0 {
				return ErrorInvalidContext
			}
			return f(dst, int32(dd), src, int32(sd), n, s)
		}
		return true
	case name == "cuGetErrorName" && d.dia.ErrorNameReturns:
		var f func(r Result) unsafe.Pointer
		purego.RegisterFunc(&f, sym)
		d.api.cuGetErrorName = func(r Result, s *unsafe.Pointer) Result {
			p := f(r)
			if p == nil {
				return ErrorInvalidValue
			}
			*s = p
			return Success
		}
		return true
	}
	return false
}

// ordinalOf is the device ordinal whose primary context is ctx, or -1.
func (d *Driver) ordinalOf(ctx uintptr) int {
	d.mu.Lock()
	defer d.mu.Unlock()
	for o, c := range d.ctxs {
		if c == ctx {
			return o
		}
	}
	return -1
}

// isUnavailable reports whether target is a sentinel an *UnavailableError
// of api matches.
func (a *API) isUnavailable(target error) bool {
	return target == ErrUnavailable || (a != nil && a.Unavailable != nil && errors.Is(a.Unavailable, target))
}
