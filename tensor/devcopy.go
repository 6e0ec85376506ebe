package tensor

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// DeviceCopier is the optional capability of buffers the CPU cannot
// address (real accelerator memory, as tensor/cuda's): bytes move in and
// out through the device's copy engines. Both calls return only once the
// copy is complete (the bytes are in place), or with an error.
type DeviceCopier interface {
	// CopyIn copies src into the buffer at off.
	CopyIn(ctx context.Context, off int64, src []byte) error
	// CopyOut copies len(dst) bytes of the buffer at off into dst.
	CopyOut(ctx context.Context, off int64, dst []byte) error
}

// PeerCopier is the optional capability of device buffers that copy from
// another device buffer without the host (same device, or a peer device
// over NVLink/PCIe P2P). CopyFrom reports false, and copies nothing, when
// it cannot reach src; Copy then bounces through host memory.
type PeerCopier interface {
	CopyFrom(ctx context.Context, off int64, src Buffer, srcOff, n int64) (bool, error)
}

// Wrapper is the optional capability of buffers that stand for all or part
// of another (a pin that keeps an object alive, a window of a buffer):
// Unwrap returns that buffer and this one's offset in it, so Copy and
// importers reach the memory itself, whatever capabilities the wrapper
// forwards.
type Wrapper interface {
	Unwrap() (Buffer, int64)
}

// Unwrap follows Wrappers down to the buffer that owns the memory and
// returns it with b's offset in it.
func Unwrap(b Buffer) (Buffer, int64) {
	var off int64
	for range 16 { // wrappers never nest deeper; a cycle must not hang
		w, ok := b.(Wrapper)
		if !ok {
			break
		}
		u, o := w.Unwrap()
		if u == nil {
			break
		}
		b, off = u, off+o
	}
	return b, off
}

// bounceChunk is the host buffer a device-to-device Copy between two
// devices that cannot reach each other moves through.
const bounceChunk = 8 << 20

// Copy copies n bytes of src at srcOff to dst at dstOff, whatever memory
// either lives in: host-visible memory is copied by the CPU, device memory
// through its DeviceCopier, and two device buffers directly when dst is a
// PeerCopier that reaches src (through host memory otherwise). It returns
// once the bytes are in dst.
func Copy(ctx context.Context, dst Buffer, dstOff int64, src Buffer, srcOff, n int64) error {
	if n < 0 || dstOff < 0 || srcOff < 0 || dstOff+n > dst.Len() || srcOff+n > src.Len() {
		return fmt.Errorf("%w: copy of %d bytes from [%d of %d] to [%d of %d]", ErrTooSmall, n, srcOff, src.Len(), dstOff, dst.Len())
	}
	if n == 0 {
		return ctx.Err()
	}
	dst, o := Unwrap(dst)
	dstOff += o
	src, o = Unwrap(src)
	srcOff += o
	to, toErr := hostBytes(dst)
	from, fromErr := hostBytes(src)
	switch {
	case toErr == nil && fromErr == nil:
		return chunked(ctx, to[dstOff:dstOff+n], from[srcOff:srcOff+n])
	case errors.Is(toErr, ErrReleased):
		return toErr
	case errors.Is(fromErr, ErrReleased):
		return fromErr
	case fromErr == nil:
		dc, ok := dst.(DeviceCopier)
		if !ok {
			return toErr
		}
		return dc.CopyIn(ctx, dstOff, from[srcOff:srcOff+n])
	case toErr == nil:
		sc, ok := src.(DeviceCopier)
		if !ok {
			return fromErr
		}
		return sc.CopyOut(ctx, srcOff, to[dstOff:dstOff+n])
	}
	if pc, ok := dst.(PeerCopier); ok {
		if done, err := pc.CopyFrom(ctx, dstOff, src, srcOff, n); done || err != nil {
			return err
		}
	}
	dc, dok := dst.(DeviceCopier)
	sc, sok := src.(DeviceCopier)
	if !dok || !sok {
		return fmt.Errorf("tensor: no way to copy from %v to %v", src.Device(), dst.Device())
	}
	bp := bouncePool.Get().(*[]byte)
	defer bouncePool.Put(bp)
	buf := *bp
	for off := int64(0); off < n; off += bounceChunk {
		k := min(bounceChunk, n-off)
		if err := sc.CopyOut(ctx, srcOff+off, buf[:k]); err != nil {
			return err
		}
		if err := dc.CopyIn(ctx, dstOff+off, buf[:k]); err != nil {
			return err
		}
	}
	return nil
}

var bouncePool = sync.Pool{New: func() any { b := make([]byte, bounceChunk); return &b }}

// hostBytes is BytesOf with a recognisable "not host visible" error.
func hostBytes(b Buffer) ([]byte, error) {
	if _, ok := b.(HostVisible); !ok {
		return nil, fmt.Errorf("tensor: buffer on %v is not host visible", b.Device())
	}
	return BytesOf(b)
}

// chunked copies in 4 MiB steps so a cancelled context stops a long copy.
func chunked(ctx context.Context, to, from []byte) error {
	const step = 4 << 20
	for off := 0; off < len(from); off += step {
		if err := ctx.Err(); err != nil {
			return err
		}
		copy(to[off:], from[off:min(off+step, len(from))])
	}
	return nil
}

// HandleKind says what the descriptor of a Handle is.
type HandleKind uint8

const (
	// HandleMemfd: FD is a memory file the receiver maps (host memory,
	// simulated arenas). The zero value.
	HandleMemfd HandleKind = iota
	// HandleCUDAFD: FD is a CUDA VMM allocation exported as a POSIX file
	// descriptor (cuMemExportToShareableHandle); it is imported with
	// cuMemImportFromShareableHandle, never mapped by the CPU.
	HandleCUDAFD
	// HandleCUDAIPC: FD is a sealed memory file holding the 64-byte legacy
	// CUDA IPC handle (cuIpcGetMemHandle) of a cuMemAlloc allocation.
	HandleCUDAIPC
	// HandleHIPFD: FD is a HIP VMM allocation exported as a POSIX file
	// descriptor (hipMemExportToShareableHandle, tensor/hip).
	HandleHIPFD
	// HandleHIPIPC: FD is a sealed memory file holding the 64-byte HIP IPC
	// handle (hipIpcGetMemHandle) of a hipMalloc allocation.
	HandleHIPIPC
)

func (k HandleKind) String() string {
	switch k {
	case HandleMemfd:
		return "memfd"
	case HandleCUDAFD:
		return "cuda-fd"
	case HandleCUDAIPC:
		return "cuda-ipc"
	case HandleHIPFD:
		return "hip-fd"
	case HandleHIPIPC:
		return "hip-ipc"
	}
	return fmt.Sprintf("handle-kind(%d)", uint8(k))
}

// Importer opens a Handle another process exported as a Buffer of this
// process, mapped with h.Access (ReadOnly: the importer cannot write it);
// near, when not nil, is the buffer the bytes will be copied to or from
// (the importer maps the handle for that buffer's device). The buffer is
// released (and its mapping dropped) with Release; the caller still owns
// and closes h.FD.
type Importer func(ctx context.Context, h Handle, near Buffer) (Buffer, error)

var importers sync.Map // HandleKind -> Importer

// RegisterImporter installs f as the way this process opens handles of
// kind k (tensor/cuda registers its two kinds when a device is opened).
// A later registration replaces an earlier one.
func RegisterImporter(k HandleKind, f Importer) { importers.Store(k, f) }

// ErrNoImporter is returned by Import for a handle kind no package of this
// process can open (a CUDA handle in a process without a CUDA device).
var ErrNoImporter = errors.New("tensor: no importer for this handle kind")

// Import opens h through the importer registered for its kind (see
// Importer).
func Import(ctx context.Context, h Handle, near Buffer) (Buffer, error) {
	f, ok := importers.Load(h.Kind)
	if !ok {
		return nil, fmt.Errorf("%w: %v", ErrNoImporter, h.Kind)
	}
	return f.(Importer)(ctx, h, near)
}

// Stager is the optional capability of device buffers whose device has
// host memory it copies to and from fastest (CUDA pinned memory: one DMA,
// no bounce through a staging chunk). Staging returns n bytes of it,
// host visible; Release gives them back.
type Stager interface {
	Staging(ctx context.Context, n int64) (Buffer, error)
}

// stagingHost backs StageFor for devices without a Stager; its cache keeps
// a loop of staged transfers from mapping fresh pages every time.
var stagingHost = NewHostMemory(0)

// StageFor returns n bytes of host memory to move device buffer b's bytes
// through, for transports that need host bytes (tcp, rdma): the device's
// own staging memory when it offers it, ordinary host memory otherwise.
// The caller releases it.
func StageFor(ctx context.Context, b Buffer, n int64) (Buffer, error) {
	if root, _ := Unwrap(b); root != nil {
		if s, ok := root.(Stager); ok {
			return s.Staging(ctx, n)
		}
	}
	return stagingHost.Alloc(ctx, n)
}

// IsDevice reports whether b (through any Wrappers) is device memory the
// CPU cannot address but that copies through DeviceCopier.
func IsDevice(b Buffer) bool {
	root, _ := Unwrap(b)
	if _, ok := root.(HostVisible); ok {
		return false
	}
	_, ok := root.(DeviceCopier)
	return ok
}

// AsyncCopier is the optional capability of device buffers that start a
// copy between the device and pinned host memory (their Stager's) and
// return before it ends: one DMA queued on a stream with an event recorded
// behind it (tensor/cuda). A transport overlaps such copies with the wire.
// The host bytes must stay untouched, and allocated, until the Pending's
// Wait has returned, whatever happened meanwhile. A pending copy keeps the
// device buffer from being released (and may hold other device resources
// of a back-end), so a caller keeps one copy of its own in flight at a
// time: a second start on the same buffer can wait behind a Release that
// waits for the first.
type AsyncCopier interface {
	// StartCopyOut starts copying len(dst) bytes of the buffer at off
	// into dst.
	StartCopyOut(ctx context.Context, off int64, dst []byte) (Pending, error)
	// StartCopyIn starts copying src into the buffer at off.
	StartCopyIn(ctx context.Context, off int64, src []byte) (Pending, error)
}

// Pending is a copy under way. Wait returns once it has ended (its bytes
// are in place, or it failed); a cancelled ctx still waits for the device
// to stop touching the memory, as Copy does. Wait may be called more than
// once; later calls return the first call's result.
type Pending interface {
	Wait(ctx context.Context) error
}

// StartCopy starts copying n bytes of src at srcOff to dst at dstOff, as
// Copy does, and returns before the copy ends: between device memory that
// is an AsyncCopier and host memory, the device's own asynchronous copy;
// otherwise Copy on a goroutine of its own. Errors arrive through Wait,
// which the caller must call before it reuses or releases either side.
func StartCopy(ctx context.Context, dst Buffer, dstOff int64, src Buffer, srcOff, n int64) Pending {
	if n > 0 && dstOff >= 0 && srcOff >= 0 && dstOff+n <= dst.Len() && srcOff+n <= src.Len() {
		d, do := Unwrap(dst)
		s, so := Unwrap(src)
		to, toErr := hostBytes(d)
		from, fromErr := hostBytes(s)
		var p Pending
		var err error
		ad, dok := d.(AsyncCopier)
		as, sok := s.(AsyncCopier)
		switch {
		case toErr == nil && fromErr != nil && sok:
			p, err = as.StartCopyOut(ctx, srcOff+so, to[dstOff+do:dstOff+do+n])
		case fromErr == nil && toErr != nil && dok:
			p, err = ad.StartCopyIn(ctx, dstOff+do, from[srcOff+so:srcOff+so+n])
		}
		if err != nil {
			return ended{err}
		}
		if p != nil {
			return p
		}
	}
	return Go(func() error { return Copy(ctx, dst, dstOff, src, srcOff, n) })
}

// Go runs a synchronous copy on a goroutine of its own and returns it as a
// Pending, for a device without asynchronous copies of its own.
func Go(copy func() error) Pending {
	g := &goCopy{done: make(chan struct{})}
	go func() {
		defer close(g.done)
		g.err = copy()
	}()
	return g
}

// ended is a Pending that has already ended.
type ended struct{ err error }

func (e ended) Wait(context.Context) error { return e.err }

// goCopy is a copy running on its own goroutine. Wait ignores ctx: the
// copy honours its own, and the caller must not touch the memory before
// it ends.
type goCopy struct {
	done chan struct{}
	err  error
}

func (g *goCopy) Wait(context.Context) error {
	<-g.done
	return g.err
}
