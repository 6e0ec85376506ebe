package cuda

import (
	"context"
	"fmt"
	"sync"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/tensorlane/tensorlane/tensor"
)

// Export shares the buffer's allocation with another process, one handle
// per allocation (never a whole pool), as tensor.Exportable asks: a VMM
// allocation as a POSIX fd from cuMemExportToShareableHandle
// (tensor.HandleCUDAFD), which the receiver imports with
// cuMemImportFromShareableHandle; a legacy allocation as its 64-byte
// cuIpcGetMemHandle handle in a sealed read-only memfd
// (tensor.HandleCUDAIPC). Both travel the same way, as a descriptor over a
// Unix socket. The caller owns and closes h.FD.
//
// Access travels in the handle and Import maps with it (a ReadOnly import
// has only CU_MEM_ACCESS_FLAGS_PROT_READ), but unlike a memory file the
// driver's descriptor does not enforce it: a process that holds the fd
// could import it writable (and a legacy IPC mapping is always writable).
// Sharing device memory trusts the importer's process as CUDA IPC does;
// the owner's pin and claim checks (fabric/shm) still bound when and
// what it is handed. Imports cannot be exported again.
func (b *Buffer) Export(access tensor.Access) (tensor.Handle, error) {
	done, err := b.use(false)
	if err != nil {
		return tensor.Handle{}, err
	}
	defer done()
	if b.wrapped {
		return tensor.Handle{}, fmt.Errorf("%w: wrapped memory belongs to another allocator; copy it into an allocation of this memory to share it", tensor.ErrNotExportable)
	}
	if !b.owned {
		return tensor.Handle{}, fmt.Errorf("%w: an imported CUDA buffer is not exported again", tensor.ErrNotExportable)
	}
	if b.n == 0 {
		return tensor.Handle{}, fmt.Errorf("%w: an empty CUDA buffer has nothing to share", tensor.ErrNotExportable)
	}
	m := b.mem
	if access != tensor.ReadOnly && access != tensor.Writable {
		return tensor.Handle{}, fmt.Errorf("%w: %v", tensor.ErrExportAccess, access)
	}
	h := tensor.Handle{FD: -1, Size: b.size, Offset: int64(b.ptr - b.base), Length: b.n, Device: m.dev, Access: access, ID: b.id}
	err = m.drv.on(m.ctx, func() error {
		if b.vmm {
			var fd int32 = -1
			if r := m.drv.api.cuMemExportToShareableHandle(unsafe.Pointer(&fd), b.handle, handlePosixFD, 0); r != Success {
				return m.drv.err("cuMemExportToShareableHandle", r)
			}
			h.FD, h.Kind = int(fd), m.drv.dia.HandleFD
			return nil
		}
		var ipc IPCMemHandle
		if r := m.drv.api.cuIpcGetMemHandle(&ipc, b.base); r != Success {
			return m.drv.err("cuIpcGetMemHandle", r)
		}
		fd, err := sealedFile(ipc.Reserved[:])
		if err != nil {
			return err
		}
		h.FD, h.Kind = fd, m.drv.dia.HandleIPC
		return nil
	})
	if err != nil {
		return tensor.Handle{}, fmt.Errorf("%w: %w", tensor.ErrNotExportable, err)
	}
	return h, nil
}

// sealedFile returns a memfd holding p that nobody can change any more.
func sealedFile(p []byte) (int, error) {
	fd, err := unix.MemfdCreate("tensorlane-cuda-ipc", unix.MFD_CLOEXEC|unix.MFD_ALLOW_SEALING)
	if err != nil {
		return -1, fmt.Errorf("cuda: memfd for an IPC handle: %w", err)
	}
	if _, err := unix.Pwrite(fd, p, 0); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("cuda: write IPC handle: %w", err)
	}
	if _, err := unix.FcntlInt(uintptr(fd), unix.F_ADD_SEALS, unix.F_SEAL_SEAL|unix.F_SEAL_SHRINK|unix.F_SEAL_GROW|unix.F_SEAL_WRITE); err != nil {
		unix.Close(fd)
		return -1, fmt.Errorf("cuda: seal IPC handle: %w", err)
	}
	return fd, nil
}

// ExportFabric returns the allocation's fabric handle, which a process on
// another node of the same NVLink fabric imports (ImportFabric): the
// multi-node analogue of the POSIX fd. It needs a VMM allocation on a
// device and driver with fabric support (IMEX running), and fails with an
// error matching ErrNotSupported otherwise.
func (b *Buffer) ExportFabric() (FabricHandle, error) {
	done, err := b.use(false)
	if err != nil {
		return FabricHandle{}, err
	}
	defer done()
	m := b.mem
	if !b.vmm || !b.owned || m.handleTypes.Load()&handleFabric == 0 {
		return FabricHandle{}, fmt.Errorf("%w: fabric handle of a %s allocation on %s", ErrNotSupported, m.Mode(), m.info.Name)
	}
	var fh FabricHandle
	err = m.drv.on(m.ctx, func() error {
		return m.drv.err("cuMemExportToShareableHandle", m.drv.api.cuMemExportToShareableHandle(unsafe.Pointer(&fh), b.handle, handleFabric, 0))
	})
	return fh, err
}

// Import maps an allocation another process exported (Export) into this
// one, for this memory's device, as a Buffer over h's [Offset,
// Offset+Length). A tensor.ReadOnly handle maps a VMM allocation with read
// access only (CU_MEM_ACCESS_FLAGS_PROT_READ): copies into it fail with
// ErrReadOnly here and the device refuses writes. Legacy IPC mappings are
// always read-write in CUDA; ReadOnly then only guards this package's
// copies. The caller still owns h.FD. Release unmaps.
func (m *Memory) Import(ctx context.Context, h tensor.Handle) (*Buffer, error) {
	readOnly := h.Access != tensor.Writable
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if h.Offset < 0 || h.Length <= 0 || h.Size <= 0 || h.Offset+h.Length > h.Size || h.FD < 0 {
		return nil, fmt.Errorf("%w: CUDA handle [%d,+%d) of %d bytes, fd %d", tensor.ErrNotExportable, h.Offset, h.Length, h.Size, h.FD)
	}
	b := &Buffer{mem: m, n: h.Length, readOnly: readOnly}
	var err error
	switch dia := m.drv.dia; h.Kind {
	case dia.HandleFD:
		err = m.importVMM(b, h, readOnly)
	case dia.HandleIPC:
		err = m.importIPC(b, h)
	default:
		return nil, fmt.Errorf("%w: %v is not a %s handle", tensor.ErrNotExportable, h.Kind, dia.name())
	}
	if err != nil {
		return nil, fmt.Errorf("%s: import %v on %v: %w", m.drv.dia.name(), h.Kind, m.dev, err)
	}
	m.mu.Lock()
	m.imported++
	m.mu.Unlock()
	return b, nil
}

func (m *Memory) importVMM(b *Buffer, h tensor.Handle, readOnly bool) error {
	if !m.drv.vmm || m.gran == 0 {
		return fmt.Errorf("%w: this process allocates without VMM (device %d)", ErrNotSupported, m.info.Ordinal)
	}
	if h.Size%m.gran != 0 {
		return fmt.Errorf("%w: allocation of %d bytes is not a multiple of the %d-byte granularity", tensor.ErrNotExportable, h.Size, m.gran)
	}
	flags := int32(memAccessReadWrite)
	if readOnly {
		flags = memAccessRead
	}
	return m.drv.on(m.ctx, func() error {
		a := &m.drv.api
		var handle uint64
		if r := a.cuMemImportFromShareableHandle(&handle, uintptr(h.FD), handlePosixFD); r != Success {
			return m.drv.err("cuMemImportFromShareableHandle", r)
		}
		ptr, err := m.mapHandle(handle, h.Size, flags)
		if err != nil {
			a.cuMemRelease(handle)
			return err
		}
		b.vmm, b.handle, b.base, b.size, b.ptr = true, handle, ptr, h.Size, ptr+uint64(h.Offset)
		return nil
	})
}

func (m *Memory) importIPC(b *Buffer, h tensor.Handle) error {
	var ipc IPCMemHandle
	if n, err := unix.Pread(h.FD, ipc.Reserved[:], 0); err != nil || n != len(ipc.Reserved) {
		return fmt.Errorf("%w: read IPC handle: %d bytes, %v", tensor.ErrNotExportable, n, err)
	}
	return m.drv.on(m.ctx, func() error {
		var p uint64
		if r := m.drv.api.cuIpcOpenMemHandle(&p, ipc, ipcLazyEnablePeerAccess); r != Success {
			return m.drv.err("cuIpcOpenMemHandle_v2", r)
		}
		b.base, b.size, b.ptr = p, h.Size, p+uint64(h.Offset)
		return nil
	})
}

// ImportFabric maps an allocation of size bytes that a process on another
// node exported with ExportFabric.
func (m *Memory) ImportFabric(ctx context.Context, fh FabricHandle, size int64, readOnly bool) (*Buffer, error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if !m.vmm || m.gran == 0 || size <= 0 || size%m.gran != 0 {
		return nil, fmt.Errorf("%w: fabric import of %d bytes on a %s memory", ErrNotSupported, size, m.Mode())
	}
	flags := int32(memAccessReadWrite)
	if readOnly {
		flags = memAccessRead
	}
	b := &Buffer{mem: m, n: size, readOnly: readOnly, vmm: true}
	err := m.drv.on(m.ctx, func() error {
		a := &m.drv.api
		var handle uint64
		if r := a.cuMemImportFromShareableHandle(&handle, uintptr(unsafe.Pointer(&fh)), handleFabric); r != Success {
			return m.drv.err("cuMemImportFromShareableHandle", r)
		}
		ptr, err := m.mapHandle(handle, size, flags)
		if err != nil {
			a.cuMemRelease(handle)
			return err
		}
		b.handle, b.base, b.size, b.ptr = handle, ptr, size, ptr
		return nil
	})
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	m.imported++
	m.mu.Unlock()
	return b, nil
}

// The process's importers, one per API: each maps a handle of its API's
// kinds for the device of the buffer the bytes go to (near) when that is
// memory of the same API, and otherwise for the first memory of the API
// opened (a GPU owner's bytes read into host memory).
var (
	impMu    sync.Mutex
	memories = map[*API][]*Memory{}
)

func registerImporters(m *Memory) {
	impMu.Lock()
	defer impMu.Unlock()
	dia := m.drv.dia
	memories[dia] = append(memories[dia], m)
	if len(memories[dia]) == 1 {
		imp := func(ctx context.Context, h tensor.Handle, near tensor.Buffer) (tensor.Buffer, error) {
			return importAny(ctx, dia, h, near)
		}
		tensor.RegisterImporter(dia.HandleFD, imp)
		tensor.RegisterImporter(dia.HandleIPC, imp)
	}
}

func unregisterImporters(m *Memory) {
	impMu.Lock()
	defer impMu.Unlock()
	list := memories[m.drv.dia]
	for i, x := range list {
		if x == m {
			memories[m.drv.dia] = append(list[:i], list[i+1:]...)
			break
		}
	}
}

func importAny(ctx context.Context, dia *API, h tensor.Handle, near tensor.Buffer) (tensor.Buffer, error) {
	var m *Memory
	if near != nil {
		near, _ = tensor.Unwrap(near)
	}
	if b, ok := near.(*Buffer); ok && b.mem.drv.dia == dia {
		m = b.mem
	} else {
		impMu.Lock()
		if list := memories[dia]; len(list) > 0 {
			m = list[0]
		}
		impMu.Unlock()
	}
	if m == nil {
		return nil, fmt.Errorf("%w: %v handle, and no %s device is open in this process", tensor.ErrNoImporter, h.Kind, dia.name())
	}
	b, err := m.Import(ctx, h)
	if err != nil {
		return nil, err
	}
	return b, nil
}
