package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"context"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/cmd/internal/capi"
)

// Device memory across the C ABI (tensorlane.h's "Device memory" section):
// every device pointer comes with its device, as DLPack names it (type 1
// CPU, 2 CUDA, 10 ROCm; index = the driver's ordinal). Device addresses
// are passed as uint64_t (a CUdeviceptr / hipDeviceptr_t), never
// dereferenced by the library; only tl_device_copy takes void pointers,
// since either side may be host memory.

func dev(typ, index C.int32_t) capi.Device { return capi.Device{Type: int(typ), Index: int(index)} }

//export tl_device_alloc
func tl_device_alloc(rt C.uint64_t, devType, devIndex C.int32_t, nbytes C.int64_t, ptr *C.uint64_t) C.int {
	return C.int(protect(func() error {
		if ptr == nil {
			return errNull("ptr")
		}
		r, err := lib.Runtime(uint64(rt))
		if err != nil {
			return err
		}
		p, err := r.DeviceAlloc(context.Background(), dev(devType, devIndex), int64(nbytes))
		if err != nil {
			return err
		}
		*ptr = C.uint64_t(p)
		return nil
	}))
}

//export tl_device_free
func tl_device_free(rt C.uint64_t, ptr C.uint64_t) C.int {
	return C.int(protect(func() error {
		r, err := lib.Runtime(uint64(rt))
		if err != nil {
			return err
		}
		return r.DeviceFree(uint64(ptr))
	}))
}

//export tl_put_device
func tl_put_device(rt C.uint64_t, devType, devIndex C.int32_t, ptr C.uint64_t, dtype *C.char, ndim C.int32_t,
	shape, strides *C.int64_t, refOut *C.uint8_t, refCap C.size_t, refLen *C.size_t) C.int {
	return C.int(protect(func() error {
		if dtype == nil {
			return errNull("dtype")
		}
		if ndim < 0 || ndim > 16 || (ndim > 0 && shape == nil) {
			return errArg("ndim %d with shape %p", ndim, shape)
		}
		r, err := lib.Runtime(uint64(rt))
		if err != nil {
			return err
		}
		ref, err := r.PutDevice(context.Background(), capi.DeviceRegion{Device: dev(devType, devIndex), Ptr: uint64(ptr),
			DType: C.GoString(dtype), Shape: int64s(shape, ndim), Strides: int64s(strides, ndim)})
		if err != nil {
			return err
		}
		var n int
		if err := output(ref, bytesOut((*C.char)(unsafe.Pointer(refOut)), refCap), &n); err != nil {
			setLen(refLen, n)
			r.Free(context.Background(), ref, time.Second) // the caller never saw the ref
			return err
		}
		setLen(refLen, len(ref)) // refs are bytes: no NUL counted
		return nil
	}))
}

//export tl_get_device
func tl_get_device(rt C.uint64_t, ref *C.uint8_t, refLen C.size_t, devType, devIndex C.int32_t, dst C.uint64_t, dstLen C.int64_t,
	op C.uint64_t, timeoutMS C.int64_t) C.int {
	return C.int(protect(func() error {
		r, err := lib.Runtime(uint64(rt))
		if err != nil {
			return err
		}
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		_, err = r.GetDevice(context.Background(), bytesIn(ref, refLen), dev(devType, devIndex), uint64(dst), int64(dstLen), uint64(op), d)
		return err
	}))
}

//export tl_device_copy
func tl_device_copy(rt C.uint64_t, dstType, dstIndex C.int32_t, dst unsafe.Pointer, srcType, srcIndex C.int32_t, src unsafe.Pointer, nbytes C.int64_t) C.int {
	return C.int(protect(func() error {
		r, err := lib.Runtime(uint64(rt))
		if err != nil {
			return err
		}
		return r.DeviceCopy(context.Background(), dev(dstType, dstIndex), dst, dev(srcType, srcIndex), src, int64(nbytes))
	}))
}
