package main

/*
#include <stddef.h>
#include <stdint.h>
*/
import "C"

import (
	"context"
	"fmt"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/cmd/internal/capi"
	"github.com/tensorlane/tensorlane/tensor"
)

// The batch entry points (tensorlane.h, "Batches"): a state dict crosses the
// boundary in one call each way instead of one per tensor. Items travel as
// C arrays of n entries; refs back to back in one buffer with their lengths
// beside. Every count and length is checked before anything is read.

// maxBatchItems bounds n; maxRefLen one ref (refs are a few hundred bytes).
const (
	maxBatchItems = 1 << 16
	maxRefLen     = 1 << 20
	maxRefsTotal  = 1 << 30 // what C.GoBytes takes (an int)
)

func batchCount(n C.int32_t) (int, error) {
	if n < 0 || n > maxBatchItems {
		return 0, errArg("batch of %d items (want 0..%d)", n, maxBatchItems)
	}
	return int(n), nil
}

// refsIn copies n refs packed back to back at p, ref i being lens[i] bytes.
func refsIn(p *C.uint8_t, lens *C.size_t, n int) ([][]byte, error) {
	if n == 0 {
		return nil, nil
	}
	if p == nil || lens == nil {
		return nil, errNull("refs or ref_lens")
	}
	ls := unsafe.Slice((*C.size_t)(lens), n)
	var total uint64
	for i, l := range ls {
		if l == 0 || l > maxRefLen {
			return nil, errArg("ref %d: length %d (want 1..%d)", i, l, maxRefLen)
		}
		total += uint64(l)
	}
	if total > maxRefsTotal {
		return nil, errArg("refs total %d bytes (at most %d)", total, maxRefsTotal)
	}
	all := C.GoBytes(unsafe.Pointer(p), C.int(total))
	out := make([][]byte, n)
	off := uint64(0)
	for i, l := range ls {
		out[i] = all[off : off+uint64(l) : off+uint64(l)]
		off += uint64(l)
	}
	return out, nil
}

// firstFailure returns the first item error, named by its index, for the
// call's return code and last error.
func firstFailure(errs []error) error {
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("item %d of %d: %w", i, len(errs), err)
		}
	}
	return nil
}

//export tl_put_batch
func tl_put_batch(rt C.uint64_t, n C.int32_t, ptrs *unsafe.Pointer, nbytes *C.int64_t, dtypes **C.char, ndims *C.int32_t,
	shapes, strides *C.int64_t, refsOut *C.uint8_t, refsCap C.size_t, refLens *C.size_t, total *C.size_t) C.int {
	return C.int(protect(func() error {
		count, err := batchCount(n)
		if err != nil || count == 0 {
			setLen(total, 0)
			return err
		}
		if ptrs == nil || nbytes == nil || dtypes == nil || ndims == nil || refLens == nil {
			return errNull("ptrs, nbytes, dtypes, ndims or ref_lens")
		}
		ps := unsafe.Slice(ptrs, count)
		ns := unsafe.Slice((*int64)(unsafe.Pointer(nbytes)), count)
		dts := unsafe.Slice(dtypes, count)
		nds := unsafe.Slice((*int32)(unsafe.Pointer(ndims)), count)
		dims := 0
		for i, d := range nds {
			if d < 0 || d > 16 {
				return errArg("item %d: ndim %d (want 0..16)", i, d)
			}
			if dts[i] == nil {
				return errNull(fmt.Sprintf("dtype of item %d", i))
			}
			dims += int(d)
		}
		if dims > 0 && shapes == nil {
			return errNull("shapes")
		}
		var shp, str []int64
		if dims > 0 {
			shp = unsafe.Slice((*int64)(unsafe.Pointer(shapes)), dims)
			if strides != nil {
				str = unsafe.Slice((*int64)(unsafe.Pointer(strides)), dims)
			}
		}
		regions := make([]capi.Region, count)
		off := 0
		for i := range regions {
			mem, err := region(ps[i], ns[i])
			if err != nil {
				return fmt.Errorf("item %d: %w", i, err)
			}
			d := int(nds[i])
			g := capi.Region{Mem: mem, DType: C.GoString(dts[i]), Shape: append([]int64(nil), shp[off:off+d]...)}
			if str != nil {
				g.Strides = append([]int64(nil), str[off:off+d]...)
			}
			off += d
			regions[i] = g
		}
		r, err := lib.Runtime(uint64(rt))
		if err != nil {
			return err
		}
		refs, err := r.PutBatch(context.Background(), regions)
		if err != nil {
			return err
		}
		need := 0
		for _, p := range refs {
			need += len(p)
		}
		setLen(total, need)
		out := bytesOut((*C.char)(unsafe.Pointer(refsOut)), refsCap)
		if len(out) < need {
			// The caller never saw the refs: take the objects back.
			for _, p := range refs {
				r.Free(context.Background(), p, time.Second)
			}
			return errTooSmall("refs_out needs %d bytes, it has %d", need, len(out))
		}
		ls := unsafe.Slice((*C.size_t)(refLens), count)
		w := 0
		for i, p := range refs {
			copy(out[w:], p)
			ls[i] = C.size_t(len(p))
			w += len(p)
		}
		return nil
	}))
}

//export tl_get_batch
func tl_get_batch(rt C.uint64_t, n C.int32_t, refs *C.uint8_t, refLens *C.size_t, op C.uint64_t, timeoutMS C.int64_t,
	ptrs *unsafe.Pointer, nbytes *C.int64_t, codes *C.int32_t) C.int {
	return C.int(protect(func() error {
		count, err := batchCount(n)
		if err != nil || count == 0 {
			return err
		}
		if ptrs == nil || nbytes == nil || codes == nil {
			return errNull("ptrs, nbytes or codes")
		}
		in, err := refsIn(refs, refLens, count)
		if err != nil {
			return err
		}
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		r, err := lib.Runtime(uint64(rt))
		if err != nil {
			return err
		}
		got, err := r.GetBatch(context.Background(), in, uint64(op), d)
		if err != nil {
			return err
		}
		ps, ns, cs := unsafe.Slice(ptrs, count), unsafe.Slice((*int64)(unsafe.Pointer(nbytes)), count), unsafe.Slice((*int32)(unsafe.Pointer(codes)), count)
		errs := make([]error, count)
		for i, g := range got {
			ps[i], ns[i], cs[i], errs[i] = g.Ptr, g.N, int32(capi.Code(g.Err)), g.Err
		}
		return firstFailure(errs)
	}))
}

//export tl_view_batch
func tl_view_batch(rt C.uint64_t, n C.int32_t, refs *C.uint8_t, refLens *C.size_t, flags C.uint32_t, op C.uint64_t, timeoutMS C.int64_t,
	views *C.uint64_t, ptrs *unsafe.Pointer, nbytes *C.int64_t, codes *C.int32_t) C.int {
	return C.int(protect(func() error {
		count, err := batchCount(n)
		if err != nil || count == 0 {
			return err
		}
		if views == nil || ptrs == nil || nbytes == nil || codes == nil {
			return errNull("views, ptrs, nbytes or codes")
		}
		if uint32(flags)&^viewFlags != 0 {
			return errArg("unknown view flags %#x", uint32(flags)&^viewFlags)
		}
		in, err := refsIn(refs, refLens, count)
		if err != nil {
			return err
		}
		d, err := timeout(int64(timeoutMS))
		if err != nil {
			return err
		}
		r, err := lib.Runtime(uint64(rt))
		if err != nil {
			return err
		}
		got, err := r.ViewBatch(context.Background(), in, capi.ViewConfig{Populate: uint32(flags)&viewPopulate != 0}, uint64(op), d)
		if err != nil {
			return err
		}
		vs, ps := unsafe.Slice((*uint64)(unsafe.Pointer(views)), count), unsafe.Slice(ptrs, count)
		ns, cs := unsafe.Slice((*int64)(unsafe.Pointer(nbytes)), count), unsafe.Slice((*int32)(unsafe.Pointer(codes)), count)
		errs := make([]error, count)
		for i, g := range got {
			vs[i], ps[i], ns[i], cs[i], errs[i] = g.View, g.Ptr, g.N, int32(capi.Code(g.Err)), g.Err
		}
		return firstFailure(errs)
	}))
}

func errTooSmall(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{tensor.ErrTooSmall}, args...)...)
}
