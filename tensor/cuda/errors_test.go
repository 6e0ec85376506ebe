package cuda

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tensorlane/tensorlane/tensor"
)

func TestErrorMapping(t *testing.T) {
	for _, c := range []struct {
		code Result
		is   error
		want bool
	}{
		{ErrorOutOfMemory, tensor.ErrOutOfMemory, true},
		{ErrorInvalidValue, tensor.ErrOutOfMemory, false},
		{ErrorNoDevice, ErrUnavailable, true},
		{ErrorStubLibrary, ErrUnavailable, true},
		{ErrorDriverMismatch, ErrUnavailable, true},
		{ErrorNotInitialized, ErrUnavailable, true},
		{ErrorOutOfMemory, ErrUnavailable, false},
		{ErrorNotSupported, ErrNotSupported, true},
		{ErrorNotPermitted, ErrNotSupported, true},
		{ErrorPeerAccessUnsupport, ErrNotSupported, true},
		{ErrorInvalidHandle, tensor.ErrNotExportable, true},
		{ErrorInvalidContext, tensor.ErrNotExportable, true},
		{ErrorIllegalAddress, ErrNotSupported, false},
	} {
		err := fmt.Errorf("wrapped: %w", &Error{Op: "cuX", Code: c.code})
		if got := errors.Is(err, c.is); got != c.want {
			t.Errorf("errors.Is(%v, %v) = %v, want %v", c.code, c.is, got, c.want)
		}
	}
}

func TestErrorText(t *testing.T) {
	for _, c := range []struct {
		err  *Error
		want string
	}{
		{&Error{Op: "cuMemCreate", Code: ErrorOutOfMemory}, "cuda: cuMemCreate: CUDA_ERROR_OUT_OF_MEMORY (2)"},
		{&Error{Op: "cuInit", Code: 12345}, "cuda: cuInit: CUresult(12345) (12345)"},
		{&Error{Op: "cuInit", Code: ErrorNoDevice, Name: "CUDA_ERROR_NO_DEVICE"}, "cuda: cuInit: CUDA_ERROR_NO_DEVICE (100)"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got %q, want %q", got, c.want)
		}
	}
	u := &UnavailableError{Library: "libcuda.so.1", Reason: "dlopen: not found", Err: &Error{Op: "cuInit", Code: ErrorNoDevice}}
	if !errors.Is(u, ErrUnavailable) || !errors.Is(u, ErrUnavailable) {
		t.Error("UnavailableError does not match ErrUnavailable")
	}
	var e *Error
	if !errors.As(u, &e) || e.Code != ErrorNoDevice {
		t.Error("UnavailableError does not unwrap to the driver's error")
	}
}

func TestFormatUUID(t *testing.T) {
	u := [16]byte{0x1e, 0x2f, 0x3a, 0x4b, 0x5c, 0x6d, 0x7e, 0x8f, 0x90, 0xa1, 0xb2, 0xc3, 0xd4, 0xe5, 0xf6, 0x07}
	if got, want := FormatUUID(u), "GPU-1e2f3a4b-5c6d-7e8f-90a1-b2c3d4e5f607"; got != want {
		t.Errorf("got %s, want %s", got, want)
	}
}
