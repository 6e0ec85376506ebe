package tensor

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/tensorlane/tensorlane/internal/pcopy"
)

// Foreign is a Buffer over host memory that something other than tensorlane
// allocated: a numpy array, a C caller's buffer. Its owner keeps the memory
// alive and unchanged until Release (the C ABI and the Python package do so
// by holding the array until the object is freed).
//
// Network paths (tcp, rdma) read and write the caller's bytes in place
// (Bytes), so they copy nothing extra. Other processes cannot map memory
// they did not share, so on one host a Foreign buffer is shared by copying
// it once, on the first Export, into memory from Stage (shareable, memfd
// backed); later Exports reuse that copy. Staged reports whether that copy
// was made, so Explain and statistics can say which happened. Producers
// that want no copy at all allocate from shareable memory in the first
// place (tensorlane.empty in Python).
type Foreign struct {
	dev       DeviceID
	data      []byte
	stage     Memory
	onRelease func()

	mu       sync.Mutex
	staged   Buffer // the shareable copy, made on the first Export
	copied   atomic.Bool
	released atomic.Bool
}

// ForeignConfig configures NewForeign. The zero value means: host memory
// (HostDevice), not exportable, nothing to call on Release.
type ForeignConfig struct {
	// Device is the device the memory lives on. Default HostDevice.
	Device DeviceID
	// Stage is shareable memory the first Export copies the bytes into;
	// nil makes Export fail with ErrNotExportable (same-host readers then
	// take a network path, loudly).
	Stage Memory
	// OnRelease runs once, after Release, so the caller can let go of the
	// memory (drop a reference to the array it came from).
	OnRelease func()
}

var (
	_ Buffer      = (*Foreign)(nil)
	_ HostVisible = (*Foreign)(nil)
	_ Exportable  = (*Foreign)(nil)
)

// NewForeign wraps data, which the caller owns, as a Buffer.
func NewForeign(data []byte, cfg ForeignConfig) *Foreign {
	dev := cfg.Device
	if dev.Kind == "" {
		dev = HostDevice
	}
	return &Foreign{dev: dev, data: data, stage: cfg.Stage, onRelease: cfg.OnRelease}
}

// Device returns the device the memory lives on.
func (f *Foreign) Device() DeviceID { return f.dev }

// Len returns the number of bytes.
func (f *Foreign) Len() int64 { return int64(len(f.data)) }

// Bytes returns the caller's memory itself, or nil after Release.
func (f *Foreign) Bytes() []byte {
	if f.released.Load() {
		return nil
	}
	return f.data
}

// Staged reports whether the bytes were copied into shareable memory (an
// Export happened), also after Release. Only same-host readers in other
// processes cause it.
func (f *Foreign) Staged() bool { return f.copied.Load() }

// Export copies the bytes into shareable memory once and exports that copy
// read-only. The copy reflects the memory at the first Export: callers must
// not change the memory after publishing it (as with any object). Writable
// exports are refused (ErrExportAccess): writes into a copy would never
// reach the caller's memory.
func (f *Foreign) Export(access Access) (Handle, error) {
	if access != ReadOnly {
		return Handle{}, fmt.Errorf("%w: foreign memory is shared as a read-only copy, not %v", ErrExportAccess, access)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.released.Load() {
		return Handle{}, ErrReleased
	}
	if err := f.stageLocked(); err != nil {
		return Handle{}, err
	}
	return ExportOf(f.staged, ReadOnly)
}

// Stage makes the shareable copy now, if it was not made yet, so that the
// first same-host reader does not wait for it: the C ABI calls it in the
// background right after a Put. An Export meanwhile waits for it.
func (f *Foreign) Stage() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.released.Load() {
		return ErrReleased
	}
	return f.stageLocked()
}

func (f *Foreign) stageLocked() error {
	if f.staged != nil {
		return nil
	}
	if f.stage == nil {
		return fmt.Errorf("%w: foreign memory on %v has no staging memory", ErrNotExportable, f.dev)
	}
	if len(f.data) == 0 {
		return fmt.Errorf("%w: an empty foreign buffer has nothing to share", ErrNotExportable)
	}
	buf, err := f.stage.Alloc(context.Background(), int64(len(f.data)))
	if err != nil {
		return fmt.Errorf("tensor: staging foreign memory for another process: %w", err)
	}
	p, err := BytesOf(buf)
	if err != nil {
		buf.Release()
		return err
	}
	if _, pre := buf.(*slabBuffer); !pre {
		populate(p) // slab memory comes populated
	}
	// Several cores when the copy is large (staging runs off the reader's
	// critical path only when it started early enough).
	if err := pcopy.Copy(context.Background(), p, f.data, pcopy.Options{}); err != nil {
		buf.Release()
		return err
	}
	f.staged = buf
	f.copied.Store(true)
	return nil
}

// Release drops the staged copy, if any, and calls OnRelease once.
// Idempotent.
func (f *Foreign) Release() error {
	if f.released.Swap(true) {
		return nil
	}
	f.mu.Lock()
	staged := f.staged
	f.staged = nil
	f.mu.Unlock()
	var err error
	if staged != nil {
		err = staged.Release()
	}
	if f.onRelease != nil {
		f.onRelease()
	}
	return err
}

// Shared lets several holders share one buffer: the creator holds the first
// reference, each Window holds another, and the buffer is released when the
// last is dropped. The C ABI uses it for shareable memory that both a
// caller (an array over it) and published objects (windows of it) hold.
type Shared struct {
	buf  Buffer
	refs atomic.Int64
}

// NewShared takes over buf with one reference, the caller's.
func NewShared(buf Buffer) *Shared {
	s := &Shared{buf: buf}
	s.refs.Store(1)
	return s
}

// Buffer returns the shared buffer (for reading; do not Release it).
func (s *Shared) Buffer() Buffer { return s.buf }

// Release drops the creator's reference. Call it once.
func (s *Shared) Release() error { return s.unref() }

func (s *Shared) unref() error {
	if s.refs.Add(-1) == 0 {
		return s.buf.Release()
	}
	return nil
}

// Window returns a new reference to bytes [off, off+n) of the buffer as a
// Buffer of its own: host visible and exportable when the shared buffer is,
// and released (dropping its reference) independently. It fails once every
// reference was dropped.
func (s *Shared) Window(off, n int64) (Buffer, error) {
	if off < 0 || n < 0 || off+n > s.buf.Len() {
		return nil, fmt.Errorf("%w: window [%d,+%d) of a %d-byte buffer", ErrBadDesc, off, n, s.buf.Len())
	}
	for {
		r := s.refs.Load()
		if r <= 0 {
			return nil, ErrReleased
		}
		if s.refs.CompareAndSwap(r, r+1) {
			break
		}
	}
	return &window{s: s, off: off, n: n}, nil
}

type window struct {
	s        *Shared
	off, n   int64
	released atomic.Bool
}

var (
	_ HostVisible = (*window)(nil)
	_ Exportable  = (*window)(nil)
)

func (w *window) Device() DeviceID { return w.s.buf.Device() }
func (w *window) Len() int64       { return w.n }

func (w *window) Bytes() []byte {
	if w.released.Load() {
		return nil
	}
	p, err := BytesOf(w.s.buf)
	if err != nil {
		return nil
	}
	return p[w.off : w.off+w.n : w.off+w.n]
}

// Export exports the shared buffer's allocation with the window's place in
// it (the granularity of sharing is the allocation, as with CUDA's).
func (w *window) Export(access Access) (Handle, error) {
	if w.released.Load() {
		return Handle{}, ErrReleased
	}
	h, err := ExportOf(w.s.buf, access)
	if err != nil {
		return Handle{}, err
	}
	h.Offset += w.off
	h.Length = w.n
	return h, nil
}

// Unwrap reaches device memory under a window (a C ABI device allocation
// published in part), so Copy, IsDevice and importers see the device's
// buffer; a window of host-visible memory is its own root, as before.
func (w *window) Unwrap() (Buffer, int64) {
	if w.released.Load() {
		return nil, 0
	}
	if _, host := w.s.buf.(HostVisible); host {
		return nil, 0
	}
	return w.s.buf, w.off
}

func (w *window) Release() error {
	if w.released.Swap(true) {
		return nil
	}
	return w.s.unref()
}

// populate asks the kernel to allocate p's pages before a copy fills them:
// fresh shared-memory pages faulted one at a time cost more than the copy
// itself (about half the time of staging 256 MiB here). Large ranges are
// populated on several cores (populate.go).
func populate(p []byte) {
	if len(p) >= 1<<20 {
		populateParallel(p)
	}
}

// Populate is populate for callers outside the package that are about to
// fill fresh host memory (the C ABI's Get into new shareable memory).
func Populate(p []byte) { populate(p) }
