package cuda

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tensorlane/tensorlane/tensor"
)

// Mode chooses how a Memory allocates.
type Mode int

const (
	// ModeAuto uses the VMM API when the device supports it with POSIX fd
	// handles, the legacy API otherwise (and says so in the log).
	ModeAuto Mode = iota
	// ModeVMM: cuMemCreate + cuMemAddressReserve + cuMemMap + cuMemSetAccess,
	// one shareable POSIX fd per allocation. NewMemory fails without it.
	ModeVMM
	// ModeLegacy: cuMemAlloc, shared with cuIpcGetMemHandle.
	ModeLegacy
)

func (m Mode) String() string {
	switch m {
	case ModeAuto:
		return "auto"
	case ModeVMM:
		return "vmm"
	case ModeLegacy:
		return "legacy"
	}
	return fmt.Sprintf("mode(%d)", int(m))
}

// Config configures a Memory. The zero value means: the default library,
// device 0, ModeAuto, 4 lanes, 8 MiB staging chunks, a one-minute bound on
// a copy whose context has no deadline, slog.Default().
type Config struct {
	// API is the driver library's API: nil means CUDA; tensor/hip passes
	// HIP's.
	API     *API
	Library string // "" = the API's LibraryPath()
	Device  int    // the driver's ordinal (as CUDA_VISIBLE_DEVICES numbers them)
	// ID is the tensor.DeviceID the memory answers to; the zero value means
	// tensor.GPUDevice(Device). A runtime sets it to the host's device
	// index when the driver numbers only the devices visible to the
	// process (CUDA_VISIBLE_DEVICES=2,3: ordinal 0 is the host's GPU 2).
	ID   tensor.DeviceID
	Mode Mode
	// Lanes is how many copies may run at once: each lane is a stream, its
	// events and, once a host copy needs them, two pinned staging chunks.
	Lanes int
	// StagingChunk is the size of each pinned host buffer a host↔device
	// copy moves through (two per lane, used alternately so the CPU's copy
	// of one chunk overlaps the DMA of the other).
	StagingChunk int64
	// CopyTimeout bounds a copy whose context has no deadline: a device
	// that does not finish one within it is hung, and the copy fails with
	// ErrCopyTimeout.
	CopyTimeout time.Duration
	Logger      *slog.Logger
}

func (c Config) withDefaults() (Config, error) {
	if c.Device < 0 {
		return c, fmt.Errorf("cuda: device ordinal %d", c.Device)
	}
	if c.Lanes <= 0 {
		c.Lanes = 4
	}
	if c.StagingChunk <= 0 {
		c.StagingChunk = 8 << 20
	}
	if c.StagingChunk < 64<<10 {
		return c, fmt.Errorf("cuda: staging chunk %d is under 64 KiB", c.StagingChunk)
	}
	if c.CopyTimeout <= 0 {
		c.CopyTimeout = time.Minute
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	return c, nil
}

// ErrCopyTimeout is returned when the device did not finish a copy within
// Config.CopyTimeout (or the context's deadline and then that bound).
var ErrCopyTimeout = errors.New("cuda: copy did not complete (device hung?)")

// allocSerial numbers this process's allocations for their handles: never
// reused, so an importer never mistakes a new allocation at a recycled
// address for one it imported before.
var allocSerial atomic.Uint64

// readOnlyWarned is set once the driver refused a read-only mapping.
var readOnlyWarned atomic.Bool

// ErrReadOnly is returned when a copy would write into a buffer imported
// read-only.
var ErrReadOnly = errors.New("cuda: buffer is mapped read-only")

// Memory is one CUDA device's memory as a tensor.Memory. Buffers are real
// device memory: not HostVisible; they implement tensor.DeviceCopier (host
// copies through pinned staging), tensor.PeerCopier (device-to-device and
// peer copies without the host) and tensor.Exportable (a per-allocation
// handle another process imports).
type Memory struct {
	cfg  Config
	drv  *Driver
	info DeviceInfo
	dev  tensor.DeviceID
	ctx  uintptr // the device's primary context
	vmm  bool
	// handleTypes are the shareable handle types requested at cuMemCreate.
	handleTypes atomic.Int32
	gran        int64 // VMM allocation granularity
	access      []memAccessDesc

	lanes   chan *lane
	closing chan struct{} // closed by Close: wakes copies waiting for a lane
	events  chan uintptr  // spare events of asynchronous copies (StartCopyOut/In)
	pinned  pinnedPool

	mu       sync.Mutex
	used     int64
	peak     int64
	allocs   int
	imported int
	closed   bool
}

var (
	_ tensor.Memory       = (*Memory)(nil)
	_ tensor.Buffer       = (*Buffer)(nil)
	_ tensor.DeviceCopier = (*Buffer)(nil)
	_ tensor.PeerCopier   = (*Buffer)(nil)
	_ tensor.Exportable   = (*Buffer)(nil)
)

// NewMemory opens device cfg.Device of the driver at cfg.Library. Without a
// usable driver it returns an error matching ErrUnavailable that says why.
// The process's importer for CUDA handles (tensor.Import) becomes this
// memory's unless one is registered already.
func NewMemory(cfg Config) (*Memory, error) {
	cfg, err := cfg.withDefaults()
	if err != nil {
		return nil, err
	}
	drv, err := LoadAPI(cfg.API, cfg.Library)
	if err != nil {
		return nil, err
	}
	info, err := drv.Device(cfg.Device)
	if err != nil {
		return nil, err
	}
	ctx, err := drv.context(cfg.Device)
	if err != nil {
		return nil, err
	}
	id := cfg.ID
	if id.Kind == "" {
		id = tensor.GPUDevice(cfg.Device)
	}
	m := &Memory{cfg: cfg, drv: drv, info: info, dev: id, ctx: ctx, closing: make(chan struct{})}
	switch {
	case cfg.Mode == ModeLegacy:
	case info.VMM && info.PosixFD:
		m.vmm = true
	case cfg.Mode == ModeVMM:
		return nil, fmt.Errorf("%w: device %d (%s) has no VMM allocations with POSIX fd handles", ErrNotSupported, cfg.Device, info.Name)
	default:
		cfg.Logger.Warn("cuda: VMM with POSIX fd handles unavailable, allocating with cuMemAlloc and sharing with legacy IPC handles",
			"device", cfg.Device, "name", info.Name, "vmm", info.VMM, "posix_fd", info.PosixFD)
	}
	if m.vmm {
		if err := m.setupVMM(); err != nil {
			return nil, err
		}
	}
	if err := m.setupLanes(); err != nil {
		m.Close()
		return nil, err
	}
	registerImporters(m)
	return m, nil
}

// setupVMM reads the allocation granularity and decides who may access
// allocations: this device, and every peer the driver says can reach it
// (so cuMemcpyPeer runs over NVLink/PCIe P2P instead of staging).
func (m *Memory) setupVMM() error {
	// The granularity is asked for POSIX-fd allocations, which every VMM
	// device makes; fabric handles are requested on top where the device
	// says it has them (and dropped if cuMemCreate refuses them).
	m.handleTypes.Store(handlePosixFD)
	prop := m.prop()
	var g uint64
	if r := m.drv.api.cuMemGetAllocationGranularity(&g, &prop, granularityMinimum); r != Success {
		return m.drv.err("cuMemGetAllocationGranularity", r)
	}
	if m.info.Fabric {
		m.handleTypes.Store(handlePosixFD | handleFabric)
	}
	if g == 0 || g&(g-1) != 0 {
		return fmt.Errorf("cuda: driver reports allocation granularity %d", g)
	}
	m.gran = int64(g)
	m.access = []memAccessDesc{{Location: memLocation{memLocationTypeDevice, int32(m.info.Ordinal)}, Flags: memAccessReadWrite}}
	for _, p := range m.info.Peers {
		m.access = append(m.access, memAccessDesc{Location: memLocation{memLocationTypeDevice, int32(p)}, Flags: memAccessReadWrite})
	}
	return nil
}

func (m *Memory) prop() memAllocationProp {
	return memAllocationProp{
		Type:                 memAllocationTypePinned,
		RequestedHandleTypes: m.handleTypes.Load(),
		Location:             memLocation{Type: memLocationTypeDevice, ID: int32(m.info.Ordinal)},
		GPUDirectRDMACapable: boolByte(m.info.GPUDirectRDMA),
	}
}

func boolByte(b bool) uint8 {
	if b {
		return 1
	}
	return 0
}

// Device returns gpu:<ordinal>.
func (m *Memory) Device() tensor.DeviceID { return m.dev }

// Info returns what the driver said about the device.
func (m *Memory) Info() DeviceInfo { return m.info }

// Driver returns the driver the memory was opened with.
func (m *Memory) Driver() *Driver { return m.drv }

// Mode returns how the memory allocates: ModeVMM or ModeLegacy.
func (m *Memory) Mode() Mode {
	if m.vmm {
		return ModeVMM
	}
	return ModeLegacy
}

// Granularity returns the size VMM allocations are rounded up to (0 for
// legacy allocations, which the driver rounds itself).
func (m *Memory) Granularity() int64 { return m.gran }

// Alloc allocates n bytes of device memory. VMM allocations are rounded up
// to the granularity (2 MiB on current GPUs): this is a per-tensor
// allocator for IPC, not a caching sub-allocator. Out of device memory
// yields a *tensor.OutOfMemoryError with the device's free bytes.
func (m *Memory) Alloc(ctx context.Context, n int64) (tensor.Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if n < 0 {
		return nil, fmt.Errorf("cuda: negative allocation %d on %v", n, m.dev)
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("cuda: %v: %w", m.dev, tensor.ErrClosed)
	}
	b := &Buffer{mem: m, n: n, owned: true, vmm: m.vmm, id: allocSerial.Add(1)}
	if n > 0 {
		var err error
		if m.vmm {
			err = m.allocVMM(b)
		} else {
			err = m.allocLegacy(b)
		}
		if errors.Is(err, tensor.ErrOutOfMemory) {
			free, _ := m.memInfo()
			return nil, &tensor.OutOfMemoryError{Device: m.dev, Requested: n, Free: free, LargestFree: free}
		}
		if err != nil {
			return nil, fmt.Errorf("cuda: alloc %d bytes on %v: %w", n, m.dev, err)
		}
	}
	m.mu.Lock()
	m.used += b.size
	m.allocs++
	m.peak = max(m.peak, m.used)
	m.mu.Unlock()
	return b, nil
}

// allocVMM creates physical memory, reserves an address range, maps one on
// the other and grants access: the four steps of cuMemMap-based
// allocation. Each step is undone if a later one fails.
func (m *Memory) allocVMM(b *Buffer) error {
	a := &m.drv.api
	size := (b.n + m.gran - 1) &^ (m.gran - 1)
	return m.drv.on(m.ctx, func() error {
		prop := m.prop()
		var h uint64
		r := a.cuMemCreate(&h, uint64(size), &prop, 0)
		if (r == ErrorNotSupported || r == ErrorInvalidValue || r == ErrorNotPermitted) && prop.RequestedHandleTypes&handleFabric != 0 {
			// Fabric handles need IMEX on multi-node systems; a device that
			// advertises them may still refuse. Keep POSIX fds and say so.
			m.handleTypes.Store(handlePosixFD)
			m.cfg.Logger.Warn("cuda: fabric handles refused, allocations are shareable by POSIX fd only", "device", m.info.Ordinal, "err", m.drv.err("cuMemCreate", r))
			prop = m.prop()
			r = a.cuMemCreate(&h, uint64(size), &prop, 0)
		}
		if r != Success {
			return m.drv.err("cuMemCreate", r)
		}
		ptr, err := m.mapHandle(h, size, memAccessReadWrite)
		if err != nil {
			a.cuMemRelease(h)
			return err
		}
		b.ptr, b.base, b.size, b.handle = ptr, ptr, size, h
		return nil
	})
}

// mapHandle reserves size bytes of address space, maps allocation h there
// and grants this device (and, for read-write mappings, its peers) access.
// Called with the context current.
func (m *Memory) mapHandle(h uint64, size int64, flags int32) (uint64, error) {
	a := &m.drv.api
	var ptr uint64
	if r := a.cuMemAddressReserve(&ptr, uint64(size), 0, 0, 0); r != Success {
		return 0, m.drv.err("cuMemAddressReserve", r)
	}
	if r := a.cuMemMap(ptr, uint64(size), 0, h, 0); r != Success {
		a.cuMemAddressFree(ptr, uint64(size))
		return 0, m.drv.err("cuMemMap", r)
	}
	access := m.access
	if flags != memAccessReadWrite {
		access = []memAccessDesc{{Location: m.access[0].Location, Flags: flags}}
	}
	r := a.cuMemSetAccess(ptr, uint64(size), &access[0], uint64(len(access)))
	if flags == memAccessRead && (r == ErrorNotSupported || r == ErrorInvalidValue) {
		// A driver without read-only device mappings: map read-write and
		// keep only this package's guard (the buffer stays ReadOnly, so
		// its copies refuse to write). Say so once.
		if !readOnlyWarned.Swap(true) {
			m.cfg.Logger.Warn("cuda: the driver refuses read-only mappings; read-only imports are guarded by tensorlane only",
				"device", m.info.Ordinal, "err", m.drv.err("cuMemSetAccess", r))
		}
		access = m.access
		r = a.cuMemSetAccess(ptr, uint64(size), &access[0], uint64(len(access)))
	}
	if r != Success {
		a.cuMemUnmap(ptr, uint64(size))
		a.cuMemAddressFree(ptr, uint64(size))
		return 0, m.drv.err("cuMemSetAccess", r)
	}
	return ptr, nil
}

func (m *Memory) allocLegacy(b *Buffer) error {
	return m.drv.on(m.ctx, func() error {
		var p uint64
		if r := m.drv.api.cuMemAlloc(&p, uint64(b.n)); r != Success {
			return m.drv.err("cuMemAlloc_v2", r)
		}
		b.ptr, b.base, b.size = p, p, b.n
		return nil
	})
}

// memInfo returns the device's free and total bytes.
func (m *Memory) memInfo() (free, total int64) {
	var f, t uint64
	m.drv.on(m.ctx, func() error {
		if m.drv.api.cuMemGetInfo(&f, &t) != Success {
			f, t = 0, uint64(m.info.TotalMemory)
		}
		return nil
	})
	return int64(f), int64(t)
}

// Stats reports the device's real capacity and free memory (the driver's
// figures, which count every process's allocations) and this memory's own
// use (rounded sizes).
func (m *Memory) Stats() tensor.MemStats {
	free, total := m.memInfo()
	m.mu.Lock()
	defer m.mu.Unlock()
	return tensor.MemStats{Device: m.dev, Backend: m.drv.dia.name(), Capacity: total, Used: m.used, Free: free, LargestFree: free,
		Allocs: m.allocs, Peak: m.peak}
}

// Close frees the memory's streams, events and staging buffers; later
// allocations and copies fail with tensor.ErrClosed. Live buffers stay
// allocated until released. Idempotent.
func (m *Memory) Close() error {
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		return nil
	}
	m.closed = true
	close(m.closing)
	m.mu.Unlock()
	unregisterImporters(m)
	// Idle lanes are freed now; a lane in use is freed by its copy when it
	// ends (putLane).
	errs := []error{m.freePinnedCache()}
	for {
		select {
		case l := <-m.lanes:
			errs = append(errs, m.freeLane(l))
			continue
		case ev := <-m.events:
			errs = append(errs, m.destroyEvent(ev))
			continue
		default:
		}
		break
	}
	return errors.Join(errs...)
}

// Buffer is an allocation of device memory, or another process's
// allocation imported into this one.
type Buffer struct {
	mem  *Memory
	ptr  uint64 // device address of byte 0 of the buffer
	base uint64 // start of the mapping (ptr - offset for imports)
	n    int64
	size int64 // bytes mapped at base (granularity-rounded for VMM)
	vmm  bool  // VMM allocation (else legacy)
	// handle is the VMM allocation handle (owned or imported).
	handle   uint64
	owned    bool   // allocated here (else imported or wrapped)
	wrapped  bool   // another library's memory (Wrap): never freed here
	id       uint64 // serial of an owned allocation (tensor.Handle.ID)
	readOnly bool

	// mu is held shared by every copy and exclusively by Release, so
	// memory is never freed under a DMA in flight.
	mu       sync.RWMutex
	released bool
}

// Device returns the device of the memory the buffer belongs to.
func (b *Buffer) Device() tensor.DeviceID { return b.mem.dev }

// Len returns the buffer's length in bytes.
func (b *Buffer) Len() int64 { return b.n }

// Ptr returns the buffer's device address (a CUdeviceptr), for handing to
// kernels and other CUDA libraries. It stays valid until Release.
func (b *Buffer) Ptr() uint64 { return b.ptr }

// ReadOnly reports whether the buffer is an import mapped read-only.
func (b *Buffer) ReadOnly() bool { return b.readOnly }

// Memory returns the memory the buffer belongs to.
func (b *Buffer) Memory() *Memory { return b.mem }

// Release frees the allocation, or unmaps an import. It waits for copies in
// progress on the buffer. Idempotent.
func (b *Buffer) Release() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.released {
		return nil
	}
	b.released = true
	m := b.mem
	if b.wrapped {
		return nil // its allocator frees it, not us
	}
	m.mu.Lock()
	if b.owned {
		m.used -= b.size
		m.allocs--
	} else {
		m.imported--
	}
	m.mu.Unlock()
	if b.size == 0 {
		return nil
	}
	a := &m.drv.api
	return m.drv.on(m.ctx, func() error {
		switch {
		case b.vmm:
			return errors.Join(
				m.drv.err("cuMemUnmap", a.cuMemUnmap(b.base, uint64(b.size))),
				m.drv.err("cuMemAddressFree", a.cuMemAddressFree(b.base, uint64(b.size))),
				m.drv.err("cuMemRelease", a.cuMemRelease(b.handle)))
		case b.owned:
			return m.drv.err("cuMemFree_v2", a.cuMemFree(b.base))
		default:
			return m.drv.err("cuIpcCloseMemHandle", a.cuIpcCloseMemHandle(b.base))
		}
	})
}

// use takes the buffer for a copy; done must be called after it.
func (b *Buffer) use(write bool) (done func(), err error) {
	b.mu.RLock()
	if b.released {
		b.mu.RUnlock()
		return nil, tensor.ErrReleased
	}
	if write && b.readOnly {
		b.mu.RUnlock()
		return nil, ErrReadOnly
	}
	return b.mu.RUnlock, nil
}

// Wrap returns a Buffer over n bytes of this device's memory at ptr that
// another library allocated (a torch or CuPy tensor, a caller of the C
// ABI), so tensor.Copy can move bytes to and from it on the device. The
// caller keeps the memory allocated until Release, which forgets it and
// frees nothing. A wrapped buffer is not exported (Export fails with
// tensor.ErrNotExportable): its allocation is not ours to share; copy it
// into a buffer of Alloc first.
func (m *Memory) Wrap(ptr uint64, n int64) (*Buffer, error) {
	if ptr == 0 || n <= 0 || ptr+uint64(n) < ptr {
		return nil, fmt.Errorf("%w: %s: wrap %d bytes at %#x", ErrBadRange, m.drv.dia.name(), n, ptr)
	}
	m.mu.Lock()
	closed := m.closed
	m.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("%s: wrap on %v: %w", m.drv.dia.name(), m.dev, tensor.ErrClosed)
	}
	return &Buffer{mem: m, ptr: ptr, base: ptr, n: n, wrapped: true}, nil
}

// ErrBadRange is returned by Wrap for a null, empty or overflowing range.
var ErrBadRange = errors.New("cuda: not a device memory range")

// GPUDirect describes the buffer's device for fabric/rdma's GPUDirect RDMA
// decision (rdma.GPUDirectInfo): libfabric's name for the driver ("cuda",
// "rocr" for HIP), and whether the driver says its NICs may access the
// memory directly and export it as a dma-buf.
func (b *Buffer) GPUDirect() (iface string, rdma, dmabuf bool) {
	iface = b.mem.drv.dia.name()
	if iface == "hip" {
		iface = "rocr"
	}
	return iface, b.mem.info.GPUDirectRDMA, b.mem.info.DMABuf
}
