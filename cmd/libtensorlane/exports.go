package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/cmd/internal/capi"
	"github.com/tensorlane/tensorlane/tensor/nodepool"
)

// The exported functions convert C values to Go ones and back, nothing
// more; lib.go does the work under protect (no panic crosses into C). The
// declarations C callers use are in tensorlane.h.

var kindNames = func() []*C.char {
	out := make([]*C.char, len(capi.Kinds))
	for i, k := range capi.Kinds {
		out[i] = C.CString(k) // once per process, never freed
	}
	return out
}()

// maxInput bounds a byte string a caller passes in (refs, a few hundred
// bytes each): a length past it is a caller's mistake (a negative int
// converted to size_t, a wrong variable), refused before anything is copied.
const maxInput = 64 << 20

// maxOutput bounds the capacity an output buffer is taken at: no output is
// that large, so a larger claimed capacity is harmless once bounded, and
// an int conversion of it could not go negative.
const maxOutput = 1 << 30

// bytesIn copies a caller's (pointer, length) input. It runs inside
// protect, like every conversion here: a hostile length panics with an
// argument error that protect returns as invalid_argument (it used to be
// truncated to 32 bits, or to panic inside the runtime as an internal
// error).
func bytesIn(p *C.uint8_t, n C.size_t) []byte {
	if p == nil || n == 0 {
		if p == nil && n != 0 {
			panic(argPanic{errArg("NULL input pointer with length %d", uint64(n))})
		}
		return nil
	}
	if uint64(n) > maxInput {
		panic(argPanic{errArg("input length %d is over the %d-byte bound (a negative length passed as size_t?)", uint64(n), maxInput)})
	}
	return append([]byte(nil), unsafe.Slice((*byte)(unsafe.Pointer(p)), int(n))...) // a copy: Go keeps no C pointer
}

// bytesOut is the caller's output buffer (nil when p is NULL: its
// capacity is then 0, whatever it says).
func bytesOut(p *C.char, n C.size_t) []byte {
	if p == nil || n == 0 {
		return nil
	}
	return unsafe.Slice((*byte)(unsafe.Pointer(p)), int(min(uint64(n), maxOutput)))
}

func setLen(dst *C.size_t, n int) {
	if dst != nil {
		*dst = C.size_t(n)
	}
}

func int64s(p *C.int64_t, n C.int32_t) []int64 {
	if p == nil || n <= 0 {
		return nil
	}
	return append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(p)), int(n))...)
}

//export tl_abi_version
func tl_abi_version() C.int { return abiVersion }

//export tl_kind_name
func tl_kind_name(kind C.int) *C.char {
	if kind < 0 || int(kind) >= len(kindNames) {
		return kindNames[1]
	}
	return kindNames[kind]
}

//export tl_last_error
func tl_last_error(msg *C.char, capacity C.size_t, n *C.size_t) C.int {
	e := lastErrorOfThread()
	var written int
	// A NULL msg has no room, whatever capacity says: only the length is
	// reported (it used to index the NULL buffer, a panic outside protect
	// that aborted the host process).
	out := bytesOut(msg, capacity)
	if err := output([]byte(e.msg), out, &written); err != nil && len(out) > 0 {
		// Truncate rather than fail: a message is for people.
		copy(out, e.msg)
		out[len(out)-1] = 0
	}
	setLen(n, written)
	return C.int(e.kind)
}

//export tl_runtime_new
func tl_runtime_new(config *C.char, rt *C.uint64_t) C.int {
	return C.int(protect(func() error {
		if rt == nil {
			return errNull("rt")
		}
		cfg := ""
		if config != nil {
			cfg = C.GoString(config)
		}
		h, err := runtimeNew(cfg)
		if err != nil {
			return err
		}
		*rt = C.uint64_t(h)
		return nil
	}))
}

//export tl_runtime_close
func tl_runtime_close(rt C.uint64_t) C.int {
	return C.int(protect(func() error { return runtimeClose(uint64(rt)) }))
}

//export tl_shutdown_all
func tl_shutdown_all() C.int {
	return C.int(protect(shutdownAll))
}

//export tl_node_pool_serve
func tl_node_pool_serve(socket *C.char, budget C.int64_t, idleMS C.int64_t) C.int {
	return C.int(protect(func() error {
		if socket == nil {
			return errNull("socket_path")
		}
		level := slog.LevelWarn
		if os.Getenv("TENSORLANE_NODE_POOL_DEBUG") == "1" {
			level = slog.LevelDebug
		}
		log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level}))
		err := nodepool.Serve(context.Background(), nodepool.Config{Socket: C.GoString(socket), Budget: int64(budget), Idle: time.Duration(idleMS) * time.Millisecond, Logger: log})
		if errors.Is(err, nodepool.ErrRunning) {
			return nil
		}
		return err
	}))
}

//export tl_alloc
func tl_alloc(rt C.uint64_t, nbytes C.int64_t, ptr *unsafe.Pointer) C.int {
	return C.int(protect(func() error {
		if ptr == nil {
			return errNull("ptr")
		}
		p, err := alloc(uint64(rt), int64(nbytes))
		if err != nil {
			return err
		}
		*ptr = p
		return nil
	}))
}

//export tl_free_memory
func tl_free_memory(rt C.uint64_t, ptr unsafe.Pointer) C.int {
	return C.int(protect(func() error { return freeMemory(uint64(rt), ptr) }))
}

//export tl_put
func tl_put(rt C.uint64_t, ptr unsafe.Pointer, nbytes C.int64_t, dtype *C.char, ndim C.int32_t,
	shape, strides *C.int64_t, refOut *C.uint8_t, refCap C.size_t, refLen *C.size_t) C.int {
	return C.int(protect(func() error {
		if dtype == nil {
			return errNull("dtype")
		}
		if ndim < 0 || ndim > 16 || (ndim > 0 && shape == nil) {
			return errArg("ndim %d with shape %p", ndim, shape)
		}
		var n int
		err := put(uint64(rt), ptr, int64(nbytes), C.GoString(dtype), int64s(shape, ndim), int64s(strides, ndim),
			bytesOut((*C.char)(unsafe.Pointer(refOut)), refCap), &n)
		setLen(refLen, n)
		return err
	}))
}

//export tl_put_gathered
func tl_put_gathered(rt C.uint64_t, block unsafe.Pointer, blockLen C.int64_t, n C.int32_t, srcs *unsafe.Pointer,
	srcLens, offsets *C.int64_t, workers C.int32_t, refOut *C.uint8_t, refCap C.size_t, refLen *C.size_t) C.int {
	return C.int(protect(func() error {
		count, err := batchCount(n)
		if err != nil {
			return err
		}
		if count > 0 && (srcs == nil || srcLens == nil || offsets == nil) {
			return errNull("srcs, src_lens or offsets")
		}
		parts := make([]capi.GatherPart, count)
		if count > 0 {
			ps := unsafe.Slice(srcs, count)
			ls := unsafe.Slice((*int64)(unsafe.Pointer(srcLens)), count)
			os := unsafe.Slice((*int64)(unsafe.Pointer(offsets)), count)
			for i := range parts {
				src, err := region(ps[i], ls[i])
				if err != nil {
					return errArg("part %d: %v", i, err)
				}
				parts[i] = capi.GatherPart{Src: src, At: os[i]}
			}
		}
		var k int
		err = putGathered(uint64(rt), block, int64(blockLen), parts, int(workers),
			bytesOut((*C.char)(unsafe.Pointer(refOut)), refCap), &k)
		setLen(refLen, k)
		return err
	}))
}

//export tl_connect
func tl_connect(rt C.uint64_t, address *C.char, timeoutMS C.int64_t) C.int {
	return C.int(protect(func() error {
		if address == nil {
			return errNull("address")
		}
		return connect(uint64(rt), C.GoString(address), int64(timeoutMS))
	}))
}

//export tl_get_into
func tl_get_into(rt C.uint64_t, ref *C.uint8_t, refLen C.size_t, dst unsafe.Pointer, dstLen C.int64_t, op C.uint64_t, timeoutMS C.int64_t) C.int {
	return C.int(protect(func() error {
		return getInto(uint64(rt), bytesIn(ref, refLen), dst, int64(dstLen), uint64(op), int64(timeoutMS))
	}))
}

//export tl_get
func tl_get(rt C.uint64_t, ref *C.uint8_t, refLen C.size_t, op C.uint64_t, timeoutMS C.int64_t, ptr *unsafe.Pointer, nbytes *C.int64_t) C.int {
	return C.int(protect(func() error {
		if ptr == nil || nbytes == nil {
			return errNull("ptr or nbytes")
		}
		p, n, err := get(uint64(rt), bytesIn(ref, refLen), uint64(op), int64(timeoutMS))
		if err != nil {
			return err
		}
		*ptr, *nbytes = p, C.int64_t(n)
		return nil
	}))
}

//export tl_view
func tl_view(rt C.uint64_t, ref *C.uint8_t, refLen C.size_t, flags C.uint32_t, op C.uint64_t, timeoutMS C.int64_t,
	view *C.uint64_t, ptr *unsafe.Pointer, nbytes *C.int64_t) C.int {
	return C.int(protect(func() error {
		if view == nil || ptr == nil || nbytes == nil {
			return errNull("view, ptr or nbytes")
		}
		h, p, n, err := viewOf(uint64(rt), bytesIn(ref, refLen), uint32(flags), uint64(op), int64(timeoutMS))
		if err != nil {
			return err
		}
		*view, *ptr, *nbytes = C.uint64_t(h), p, C.int64_t(n)
		return nil
	}))
}

//export tl_view_release
func tl_view_release(rt C.uint64_t, view C.uint64_t) C.int {
	return C.int(protect(func() error { return viewRelease(uint64(rt), uint64(view)) }))
}

//export tl_cancel
func tl_cancel(rt C.uint64_t, op C.uint64_t) C.int {
	return C.int(protect(func() error { return cancelOp(uint64(rt), uint64(op)) }))
}

//export tl_release
func tl_release(rt C.uint64_t, ref *C.uint8_t, refLen C.size_t) C.int {
	return C.int(protect(func() error { return release(uint64(rt), bytesIn(ref, refLen)) }))
}

//export tl_hold
func tl_hold(rt C.uint64_t, ref *C.uint8_t, refLen C.size_t, timeoutMS C.int64_t) C.int {
	return C.int(protect(func() error { return hold(uint64(rt), bytesIn(ref, refLen), int64(timeoutMS)) }))
}

//export tl_free
func tl_free(rt C.uint64_t, ref *C.uint8_t, refLen C.size_t, timeoutMS C.int64_t) C.int {
	return C.int(protect(func() error { return free(uint64(rt), bytesIn(ref, refLen), int64(timeoutMS)) }))
}

//export tl_explain
func tl_explain(rt C.uint64_t, ref *C.uint8_t, refLen C.size_t, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return C.int(protect(func() error {
		var w int
		err := explain(uint64(rt), bytesIn(ref, refLen), bytesOut(out, capacity), &w)
		setLen(n, w)
		return err
	}))
}

//export tl_ref_info
func tl_ref_info(ref *C.uint8_t, refLen C.size_t, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return C.int(protect(func() error {
		var w int
		err := refInfo(bytesIn(ref, refLen), bytesOut(out, capacity), &w)
		setLen(n, w)
		return err
	}))
}

//export tl_stats
func tl_stats(rt C.uint64_t, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return C.int(protect(func() error {
		var w int
		err := stats(uint64(rt), bytesOut(out, capacity), &w)
		setLen(n, w)
		return err
	}))
}

func main() {} // a c-shared library needs a main package; it never runs
