package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"context"
	"unsafe"

	"github.com/tensorlane/tensorlane/cmd/internal/capi"
)

// The weight-sync exports (slots, pushes, broadcasts, asynchronous
// operations): conversions only, as in exports.go; cmd/internal/capi/push.go
// does the work. Declared in tensorlane.h's weight-sync section.

func withRuntime(h C.uint64_t, f func(r *capi.Runtime) error) C.int {
	return C.int(protect(func() error {
		r, err := lib.Runtime(uint64(h))
		if err != nil {
			return err
		}
		return f(r)
	}))
}

func jsonOut(v any, out *C.char, capacity C.size_t, n *C.size_t) error {
	var w int
	err := outputJSON(v, bytesOut(out, capacity), &w)
	setLen(n, w)
	return err
}

//export tl_slot_reserve
func tl_slot_reserve(rt C.uint64_t, ptr unsafe.Pointer, nbytes C.int64_t, dtype *C.char, ndim C.int32_t,
	shape, strides *C.int64_t, flags C.uint32_t, slot *C.uint64_t, refOut *C.uint8_t, refCap C.size_t, refLen *C.size_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		if dtype == nil || slot == nil {
			return errNull("dtype or slot")
		}
		if ndim < 0 || ndim > 16 || (ndim > 0 && shape == nil) {
			return errArg("ndim %d with shape %p", ndim, shape)
		}
		mem, err := region(ptr, int64(nbytes))
		if err != nil {
			return err
		}
		out := bytesOut((*C.char)(unsafe.Pointer(refOut)), refCap)
		if len(out) < 2048 {
			// Learning the size by failing would reserve a slot twice.
			return errArg("ref_cap %d: pass at least 2048 bytes", refCap)
		}
		h, ref, err := r.Reserve(context.Background(), capi.Region{Mem: mem, DType: C.GoString(dtype), Shape: int64s(shape, ndim), Strides: int64s(strides, ndim)}, uint32(flags))
		if err != nil {
			return err
		}
		var n int
		if err := output(ref, out, &n); err != nil {
			r.SlotClose(h)
			return err
		}
		setLen(refLen, len(ref))
		*slot = C.uint64_t(h)
		return nil
	})
}

//export tl_slot_wait
func tl_slot_wait(rt C.uint64_t, slot C.uint64_t, after C.uint64_t, timeoutMS C.int64_t, gen *C.uint64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		g, err := r.SlotWait(context.Background(), uint64(slot), uint64(after), d)
		if gen != nil {
			*gen = C.uint64_t(g)
		}
		return err
	})
}

//export tl_slots_wait
func tl_slots_wait(rt C.uint64_t, slots *C.uint64_t, after *C.uint64_t, n C.int32_t, timeoutMS C.int64_t, gens *C.uint64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		if slots == nil || after == nil || n <= 0 {
			return errArg("%d slots (slots %p, after %p)", n, slots, after)
		}
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		hs := append([]uint64(nil), unsafe.Slice((*uint64)(unsafe.Pointer(slots)), int(n))...)
		as := append([]uint64(nil), unsafe.Slice((*uint64)(unsafe.Pointer(after)), int(n))...)
		got, err := r.SlotsWait(context.Background(), hs, as, d)
		if gens != nil && got != nil {
			copy(unsafe.Slice((*uint64)(unsafe.Pointer(gens)), int(n)), got)
		}
		return err
	})
}

//export tl_slot_done
func tl_slot_done(rt C.uint64_t, slot C.uint64_t, gen C.uint64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		return r.SlotDone(context.Background(), uint64(slot), uint64(gen))
	})
}

//export tl_slot_info
func tl_slot_info(rt C.uint64_t, slot C.uint64_t, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		info, err := r.SlotInfo(uint64(slot))
		if err != nil {
			return err
		}
		return jsonOut(info, out, capacity, n)
	})
}

//export tl_slot_close
func tl_slot_close(rt C.uint64_t, slot C.uint64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error { return r.SlotClose(uint64(slot)) })
}

//export tl_push
func tl_push(rt C.uint64_t, src *C.uint8_t, srcLen C.size_t, dst *C.uint8_t, dstLen C.size_t, timeoutMS C.int64_t,
	out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		if int(capacity) < capi.MaxItemJSON {
			return errArg("capacity %d: pass at least %d bytes", capacity, capi.MaxItemJSON)
		}
		x, err := r.Push(context.Background(), bytesIn(src, srcLen), bytesIn(dst, dstLen), d)
		if err != nil {
			return err
		}
		return jsonOut(x, out, capacity, n)
	})
}

//export tl_push_runs
func tl_push_runs(rt C.uint64_t, src *C.uint8_t, srcLen C.size_t, dst *C.uint8_t, dstLen C.size_t, runs *C.int64_t, nRuns C.size_t,
	timeoutMS C.int64_t, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		if int(capacity) < capi.MaxItemJSON {
			return errArg("capacity %d: pass at least %d bytes", capacity, capi.MaxItemJSON)
		}
		if runs == nil || nRuns == 0 || uint64(nRuns) > maxInput/16 {
			return errArg("runs: %d (offset, length) pairs at %p", uint64(nRuns), runs)
		}
		rs := append([]int64(nil), unsafe.Slice((*int64)(unsafe.Pointer(runs)), 2*int(nRuns))...) // a copy: Go keeps no C pointer
		x, err := r.PushRuns(context.Background(), bytesIn(src, srcLen), bytesIn(dst, dstLen), rs, d)
		if err != nil {
			return err
		}
		return jsonOut(x, out, capacity, n)
	})
}

//export tl_push_batch
func tl_push_batch(rt C.uint64_t, request *C.char, timeoutMS C.int64_t, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		if request == nil {
			return errNull("request")
		}
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		items, err := r.PushBatch(context.Background(), []byte(C.GoString(request)), d)
		if err != nil {
			return err
		}
		return jsonOut(items, out, capacity, n)
	})
}

//export tl_broadcast_start
func tl_broadcast_start(rt C.uint64_t, request *C.char, timeoutMS C.int64_t, op *C.uint64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		if request == nil || op == nil {
			return errNull("request or op")
		}
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		h, err := r.StartBroadcast(context.Background(), []byte(C.GoString(request)), d)
		if err != nil {
			return err
		}
		*op = C.uint64_t(h)
		return nil
	})
}

//export tl_broadcast_explain
func tl_broadcast_explain(rt C.uint64_t, request *C.char, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		if request == nil {
			return errNull("request")
		}
		p, err := r.ExplainBroadcast([]byte(C.GoString(request)))
		if err != nil {
			return err
		}
		return jsonOut(p, out, capacity, n)
	})
}

//export tl_op_progress
func tl_op_progress(rt C.uint64_t, op C.uint64_t, done, total *C.int64_t, finished *C.int32_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		p, end, err := r.OpProgress(uint64(op))
		if err != nil {
			return err
		}
		if done != nil {
			*done = C.int64_t(p.Done)
		}
		if total != nil {
			*total = C.int64_t(p.Total)
		}
		if finished != nil {
			*finished = 0
			if end {
				*finished = 1
			}
		}
		return nil
	})
}

//export tl_op_wait
func tl_op_wait(rt C.uint64_t, op C.uint64_t, timeoutMS C.int64_t, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		res, err := r.OpWait(context.Background(), uint64(op), d)
		if err != nil {
			return err
		}
		return jsonOut(res, out, capacity, n)
	})
}

//export tl_op_wait_consumed
func tl_op_wait_consumed(rt C.uint64_t, op C.uint64_t, timeoutMS C.int64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		return r.OpWaitConsumed(context.Background(), uint64(op), d)
	})
}

//export tl_op_cancel
func tl_op_cancel(rt C.uint64_t, op C.uint64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error { return r.OpCancel(uint64(op)) })
}

//export tl_op_close
func tl_op_close(rt C.uint64_t, op C.uint64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error { return r.OpClose(uint64(op)) })
}

//export tl_wait_consumed
func tl_wait_consumed(rt C.uint64_t, slot *C.uint8_t, slotLen C.size_t, gen C.uint64_t, timeoutMS C.int64_t) C.int {
	return withRuntime(rt, func(r *capi.Runtime) error {
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		return r.WaitConsumed(context.Background(), bytesIn(slot, slotLen), uint64(gen), d)
	})
}

//export tl_delta_bound
func tl_delta_bound(nbytes C.int64_t) C.int64_t { return C.int64_t(capi.DeltaBound(int64(nbytes))) }

//export tl_delta_encode
func tl_delta_encode(prev, cur unsafe.Pointer, nbytes C.int64_t, elem C.int32_t, out unsafe.Pointer, capacity C.int64_t,
	outLen *C.int64_t, changed *C.int64_t) C.int {
	return deltaEncode(prev, cur, nbytes, elem, out, capacity, outLen, changed, capi.DeltaEncode)
}

//export tl_delta_encode_advance
func tl_delta_encode_advance(prev, cur unsafe.Pointer, nbytes C.int64_t, elem C.int32_t, out unsafe.Pointer,
	capacity C.int64_t, outLen *C.int64_t, changed *C.int64_t) C.int {
	return deltaEncode(prev, cur, nbytes, elem, out, capacity, outLen, changed, capi.DeltaEncodeAdvance)
}

// deltaEncode checks the regions of tl_delta_encode's arguments and runs
// encode on them.
func deltaEncode(prev, cur unsafe.Pointer, nbytes C.int64_t, elem C.int32_t, out unsafe.Pointer, capacity C.int64_t,
	outLen *C.int64_t, changed *C.int64_t, encode func(prev, cur, out []byte, elem int) (int, int64, error)) C.int {
	return C.int(protect(func() error {
		p, err := region(prev, int64(nbytes))
		if err != nil {
			return err
		}
		c, err := region(cur, int64(nbytes))
		if err != nil {
			return err
		}
		o, err := region(out, int64(capacity))
		if err != nil {
			return err
		}
		n, ch, err := encode(p, c, o, int(elem))
		if err != nil {
			return err
		}
		if outLen != nil {
			*outLen = C.int64_t(n)
		}
		if changed != nil {
			*changed = C.int64_t(ch)
		}
		return nil
	}))
}

//export tl_delta_codec_rate
func tl_delta_codec_rate() C.double { return C.double(capi.DeltaCodecRate()) }

//export tl_delta_check
func tl_delta_check(base unsafe.Pointer, nbytes C.int64_t, delta unsafe.Pointer, deltaLen C.int64_t) C.int {
	return withDelta(base, nbytes, delta, deltaLen, capi.DeltaCheck)
}

//export tl_delta_decode
func tl_delta_decode(base unsafe.Pointer, nbytes C.int64_t, delta unsafe.Pointer, deltaLen C.int64_t) C.int {
	return withDelta(base, nbytes, delta, deltaLen, capi.DeltaDecode)
}

//export tl_delta_revert
func tl_delta_revert(base unsafe.Pointer, nbytes C.int64_t, delta unsafe.Pointer, deltaLen C.int64_t) C.int {
	return withDelta(base, nbytes, delta, deltaLen, capi.DeltaRevert)
}

// withDelta checks a base region and a delta region, then runs f on them.
func withDelta(base unsafe.Pointer, nbytes C.int64_t, delta unsafe.Pointer, deltaLen C.int64_t, f func(base, delta []byte) error) C.int {
	return C.int(protect(func() error {
		b, err := region(base, int64(nbytes))
		if err != nil {
			return err
		}
		d, err := region(delta, int64(deltaLen))
		if err != nil {
			return err
		}
		return f(b, d)
	}))
}

//export tl_reshard_plan
func tl_reshard_plan(request *C.char, out *C.char, capacity C.size_t, n *C.size_t) C.int {
	return C.int(protect(func() error {
		if request == nil {
			return errNull("request")
		}
		p, err := capi.ReshardPlan([]byte(C.GoString(request)))
		if err != nil {
			return err
		}
		return jsonOut(p, out, capacity, n)
	}))
}
