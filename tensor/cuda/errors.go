package cuda

import (
	"errors"
	"fmt"

	"github.com/tensorlane/tensorlane/tensor"
)

// ErrUnavailable matches every error that says CUDA cannot be used in this
// process: no driver library, a library without the entry points we need,
// no device, a driver that refuses to initialise. Callers fall back to host
// or simulated memory on it.
var ErrUnavailable = errors.New("cuda: unavailable")

// UnavailableError says why CUDA is unavailable: which library was tried
// and what the loader or the driver answered.
type UnavailableError struct {
	API     *API   // the library's API (nil: CUDA)
	Library string // the path given to dlopen
	Reason  string // the loader's message, or what was missing
	Err     error  // the driver's *Error, when the driver answered
}

func (e *UnavailableError) Error() string {
	return fmt.Sprintf("%s: unavailable (%s): %s", e.API.name(), e.Library, e.Reason)
}

// Is makes errors.Is(err, ErrUnavailable) true, and errors.Is with the
// API's own sentinel (hip.ErrUnavailable).
func (e *UnavailableError) Is(target error) bool { return e.API.isUnavailable(target) }

// Unwrap returns the driver's error, if any.
func (e *UnavailableError) Unwrap() error { return e.Err }

// Error is a failed driver call: the call, its CUresult and the driver's
// name for it.
type Error struct {
	Op   string // the entry point, "cuMemCreate"
	Code Result
	Name string // "CUDA_ERROR_OUT_OF_MEMORY", from cuGetErrorName when it knows
	api  *API   // the driver's API (nil: CUDA)
}

func (e *Error) Error() string {
	name := e.Name
	if name == "" {
		name = e.Code.String()
	}
	return fmt.Sprintf("%s: %s: %s (%d)", e.api.name(), e.Op, name, int32(e.Code))
}

// Is maps driver results onto the library's conditions, so callers test
// conditions and not codes: out of memory matches tensor.ErrOutOfMemory,
// "no device" and friends match ErrUnavailable, an unsupported feature
// matches ErrNotSupported, a handle that does not open matches
// tensor.ErrNotExportable.
func (e *Error) Is(target error) bool {
	if target != ErrUnavailable && e.api.isUnavailable(target) {
		target = ErrUnavailable // the API's own sentinel means the same
	}
	switch target {
	case tensor.ErrOutOfMemory:
		return e.Code == ErrorOutOfMemory
	case ErrUnavailable:
		switch e.Code {
		case ErrorNoDevice, ErrorStubLibrary, ErrorDeviceUnavailable, ErrorNotInitialized,
			ErrorDeinitialized, ErrorSystemNotReady, ErrorDriverMismatch, ErrorCompatNotSupported:
			return true
		}
	case ErrNotSupported:
		return e.Code == ErrorNotSupported || e.Code == ErrorNotPermitted || e.Code == ErrorPeerAccessUnsupport
	case tensor.ErrNotExportable:
		return e.Code == ErrorInvalidHandle || e.Code == ErrorInvalidContext
	}
	return false
}

// ErrNotSupported matches driver errors for features this device or driver
// does not have (VMM, fabric handles, peer access).
var ErrNotSupported = errors.New("cuda: not supported by this device or driver")

// String names the codes this package knows without asking the driver.
func (r Result) String() string {
	if s, ok := resultNames[r]; ok {
		return s
	}
	return fmt.Sprintf("CUresult(%d)", int32(r))
}

var resultNames = map[Result]string{
	Success: "CUDA_SUCCESS", ErrorInvalidValue: "CUDA_ERROR_INVALID_VALUE",
	ErrorOutOfMemory: "CUDA_ERROR_OUT_OF_MEMORY", ErrorNotInitialized: "CUDA_ERROR_NOT_INITIALIZED",
	ErrorDeinitialized: "CUDA_ERROR_DEINITIALIZED", ErrorStubLibrary: "CUDA_ERROR_STUB_LIBRARY",
	ErrorDeviceUnavailable: "CUDA_ERROR_DEVICE_UNAVAILABLE", ErrorNoDevice: "CUDA_ERROR_NO_DEVICE",
	ErrorInvalidDevice: "CUDA_ERROR_INVALID_DEVICE", ErrorInvalidContext: "CUDA_ERROR_INVALID_CONTEXT",
	ErrorAlreadyMapped: "CUDA_ERROR_ALREADY_MAPPED", ErrorPeerAccessUnsupport: "CUDA_ERROR_PEER_ACCESS_UNSUPPORTED",
	ErrorOperatingSystem: "CUDA_ERROR_OPERATING_SYSTEM", ErrorInvalidHandle: "CUDA_ERROR_INVALID_HANDLE",
	ErrorNotFound: "CUDA_ERROR_NOT_FOUND", ErrorNotReady: "CUDA_ERROR_NOT_READY",
	ErrorIllegalAddress: "CUDA_ERROR_ILLEGAL_ADDRESS", ErrorPeerAccessEnabled: "CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED",
	ErrorNotPermitted: "CUDA_ERROR_NOT_PERMITTED", ErrorNotSupported: "CUDA_ERROR_NOT_SUPPORTED",
	ErrorSystemNotReady: "CUDA_ERROR_SYSTEM_NOT_READY", ErrorDriverMismatch: "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
	ErrorCompatNotSupported: "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE", ErrorUnknown: "CUDA_ERROR_UNKNOWN",
}
