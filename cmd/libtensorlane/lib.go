package main

import (
	"context"
	"encoding/json"

	"fmt"
	"runtime/debug"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/cmd/internal/capi"
	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
)

// abiVersion changes only if a function's meaning changes (never so far).
const abiVersion = 1

// lib holds the process's runtimes. The C ABI has no context: calls are
// bounded by their timeouts and the runtimes' transfer timeouts instead.
var lib = capi.New()

// lastErrors keeps each OS thread's last error, as errno does: a cgo call
// runs on the thread that made it, so the thread id names the caller.
var (
	errMu      sync.Mutex
	lastErrors = map[int]lastError{}
)

type lastError struct {
	kind int
	msg  string
}

// maxThreads bounds lastErrors: threads that come and go (a pool) must not
// grow it forever. Past the bound the oldest entries are dropped wholesale.
const maxThreads = 4096

// fail records err for the calling thread and returns its kind (0 for nil).
func fail(err error) int {
	k := capi.Code(err)
	if k == 0 {
		return 0
	}
	tid := unix.Gettid()
	errMu.Lock()
	if len(lastErrors) >= maxThreads {
		clear(lastErrors)
	}
	lastErrors[tid] = lastError{kind: k, msg: err.Error()}
	errMu.Unlock()
	return k
}

func lastErrorOfThread() lastError {
	errMu.Lock()
	defer errMu.Unlock()
	return lastErrors[unix.Gettid()]
}

// protect runs one call of the ABI: a panic (a bug) becomes an error of kind
// other with its stack in the message, never a crash of the host process.
func protect(f func() error) (code int) {
	defer func() {
		if r := recover(); r != nil {
			if a, ok := r.(argPanic); ok {
				code = fail(a.err)
				return
			}
			code = fail(fmt.Errorf("tensorlane: internal error (please report): %v\n%s", r, debug.Stack()))
		}
	}()
	return fail(f())
}

// argPanic carries a caller's mistake found by a conversion helper
// (bytesIn) out of the export it runs in, to protect, which returns it as
// its error: the helpers keep their simple signatures.
type argPanic struct{ err error }

// output copies p and a terminating NUL into out, or says how much room
// is needed.
func output(p, out []byte, n *int) error {
	*n = len(p) + 1
	if len(out) < len(p)+1 {
		return fmt.Errorf("%w: output needs %d bytes, the buffer has %d", tensor.ErrTooSmall, len(p)+1, len(out))
	}
	copy(out, p)
	out[len(p)] = 0
	return nil
}

func outputJSON(v any, out []byte, n *int) error {
	p, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return output(p, out, n)
}

func timeout(ms int64) (time.Duration, error) {
	if ms < 0 {
		return 0, fmt.Errorf("%w: negative timeout %d ms", capi.ErrInvalidArgument, ms)
	}
	return time.Duration(ms) * time.Millisecond, nil
}

func runtimeNew(config string) (uint64, error) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return lib.NewRuntime(ctx, []byte(config))
}

func runtimeClose(h uint64) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return lib.Close(ctx, h)
}

func shutdownAll() error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return lib.CloseAll(ctx)
}

func alloc(h uint64, n int64) (unsafe.Pointer, error) {
	r, err := lib.Runtime(h)
	if err != nil {
		return nil, err
	}
	return r.Alloc(context.Background(), n)
}

func freeMemory(h uint64, p unsafe.Pointer) error {
	// Also after the runtime closed: its memory stayed mapped for arrays
	// still over it until now.
	return lib.FreeMemory(h, p)
}

// maxRegion bounds a region's length: no process has a larger address
// space (48-bit user addresses), and unsafe.Slice panics past it.
const maxRegion = 1 << 47

// region checks a caller's (pointer, length) pair.
func region(p unsafe.Pointer, n int64) ([]byte, error) {
	switch {
	case n < 0:
		return nil, fmt.Errorf("%w: negative length %d", capi.ErrInvalidArgument, n)
	case n > 0 && p == nil:
		return nil, fmt.Errorf("%w: NULL pointer with length %d", capi.ErrInvalidArgument, n)
	case n == 0:
		return nil, nil
	case n > maxRegion || uintptr(p)+uintptr(n) < uintptr(p):
		return nil, fmt.Errorf("%w: region of %d bytes at %p is larger than any address space", capi.ErrInvalidArgument, n, p)
	}
	return unsafe.Slice((*byte)(p), n), nil
}

func put(h uint64, p unsafe.Pointer, n int64, dtype string, shape, strides []int64, out []byte, outLen *int) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	mem, err := region(p, n)
	if err != nil {
		return err
	}
	ref, err := r.Put(context.Background(), capi.Region{Mem: mem, DType: dtype, Shape: shape, Strides: strides})
	if err != nil {
		return err
	}
	return outputRef(r, ref, out, outLen)
}

// outputRef hands a new object's ref to the caller, or frees the object
// when the caller cannot take it (it never saw the ref).
func outputRef(r *capi.Runtime, ref, out []byte, outLen *int) error {
	if err := output(ref, out, outLen); err != nil {
		r.Free(context.Background(), ref, time.Second)
		return err
	}
	*outLen = len(ref) // refs are bytes, not strings: no NUL counted
	return nil
}

func putGathered(h uint64, p unsafe.Pointer, n int64, parts []capi.GatherPart, workers int, out []byte, outLen *int) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	block, err := region(p, n)
	if err != nil {
		return err
	}
	ref, err := r.PutGathered(context.Background(), block, parts, workers)
	if err != nil {
		return err
	}
	return outputRef(r, ref, out, outLen)
}

func connect(h uint64, address string, timeoutMS int64) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	d, err := timeout(timeoutMS)
	if err != nil {
		return err
	}
	return r.Connect(context.Background(), address, d)
}

func getInto(h uint64, ref []byte, p unsafe.Pointer, n int64, op uint64, timeoutMS int64) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	dst, err := region(p, n)
	if err != nil {
		return err
	}
	d, err := timeout(timeoutMS)
	if err != nil {
		return err
	}
	_, err = r.GetInto(context.Background(), ref, dst, op, d)
	return err
}

func get(h uint64, ref []byte, op uint64, timeoutMS int64) (unsafe.Pointer, int64, error) {
	r, err := lib.Runtime(h)
	if err != nil {
		return nil, 0, err
	}
	d, err := timeout(timeoutMS)
	if err != nil {
		return nil, 0, err
	}
	p, n, _, err := r.Get(context.Background(), ref, op, d)
	return p, n, err
}

// Flags of tl_view.
const (
	viewPopulate = 1 << 0 // TL_VIEW_POPULATE
	viewFlags    = viewPopulate
)

func viewOf(h uint64, ref []byte, flags uint32, op uint64, timeoutMS int64) (uint64, unsafe.Pointer, int64, error) {
	r, err := lib.Runtime(h)
	if err != nil {
		return 0, nil, 0, err
	}
	if flags&^viewFlags != 0 {
		return 0, nil, 0, errArg("unknown view flags %#x", flags&^viewFlags)
	}
	d, err := timeout(timeoutMS)
	if err != nil {
		return 0, nil, 0, err
	}
	v, p, n, _, err := r.View(context.Background(), ref, capi.ViewConfig{Populate: flags&viewPopulate != 0}, op, d)
	return v, p, n, err
}

func viewRelease(h, view uint64) error {
	// Also after the runtime closed: the view stayed mapped until now.
	return lib.ReleaseView(h, view)
}

func cancelOp(h uint64, op uint64) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	if !r.Cancel(op) {
		return fmt.Errorf("%w: no read %d in flight", rdt.ErrObjectNotFound, op)
	}
	return nil
}

func release(h uint64, ref []byte) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return r.Release(ctx, ref)
}

func hold(h uint64, ref []byte, timeoutMS int64) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	d, err := timeout(timeoutMS)
	if err != nil {
		return err
	}
	return r.Hold(context.Background(), ref, d)
}

func free(h uint64, ref []byte, timeoutMS int64) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	d, err := timeout(timeoutMS)
	if err != nil {
		return err
	}
	return r.Free(context.Background(), ref, d)
}

func explain(h uint64, ref []byte, out []byte, n *int) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	e, err := r.Explain(ref)
	if err != nil {
		return err
	}
	return outputJSON(e, out, n)
}

func refInfo(ref []byte, out []byte, n *int) error {
	info, err := capi.DescribeRef(ref)
	if err != nil {
		return err
	}
	return outputJSON(info, out, n)
}

func stats(h uint64, out []byte, n *int) error {
	r, err := lib.Runtime(h)
	if err != nil {
		return err
	}
	return outputJSON(r.Stats(), out, n)
}

func errNull(what string) error {
	return fmt.Errorf("%w: NULL %s", capi.ErrInvalidArgument, what)
}

func errArg(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{capi.ErrInvalidArgument}, args...)...)
}
