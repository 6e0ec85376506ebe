package capi

import (
	"context"
	"fmt"
	"sync"
	"time"
	"unsafe"

	"github.com/tensorlane/tensorlane/rdt"
	"github.com/tensorlane/tensorlane/tensor"
	"github.com/tensorlane/tensorlane/tensor/cuda"
)

// Device memory across the C ABI. A device pointer never crosses alone: it
// comes with its Device, named as DLPack names devices (the type code and
// the driver's ordinal, what torch calls cuda:0), so the library finds the
// memory it lives in (the runtime's CUDA or HIP memory of that ordinal,
// tensor/backend) and never mistakes a device address for a host one.
//
// A runtime's GPUs are real memory when its back-end says so
// (TENSORLANE_DEVICE_BACKEND=cuda or hip for a preset host, auto on a
// discovered one); otherwise these calls fail with unknown_device, saying
// the runtime's devices are simulated.

// DLPack device type codes the C ABI accepts.
const (
	DLCPU  = 1  // kDLCPU: a host pointer
	DLCUDA = 2  // kDLCUDA
	DLROCM = 10 // kDLROCM
)

// Device names a device the way DLPack does.
type Device struct {
	Type  int // DLCPU, DLCUDA, DLROCM
	Index int // the driver's ordinal (CUDA_VISIBLE_DEVICES numbering); 0 for the host
}

func (d Device) String() string {
	switch d.Type {
	case DLCPU:
		return "cpu"
	case DLCUDA:
		return fmt.Sprintf("cuda:%d", d.Index)
	case DLROCM:
		return fmt.Sprintf("rocm:%d", d.Index)
	}
	return fmt.Sprintf("dlpack-device(%d):%d", d.Type, d.Index)
}

// deviceState is a runtime's device allocations (kept beside Runtime, which
// capi.go owns; released on shutdown).
type deviceState struct {
	mu     sync.Mutex
	allocs map[uint64]*devAllocation
}

type devAllocation struct {
	shared *tensor.Shared
	mem    *cuda.Memory
	base   uint64
	n      int64
}

var devStates sync.Map // *Runtime -> *deviceState

func (r *Runtime) devState() *deviceState {
	v, _ := devStates.LoadOrStore(r, &deviceState{allocs: map[uint64]*devAllocation{}})
	return v.(*deviceState)
}

// releaseDevice gives back the device allocations the caller did not free
// (at shutdown; objects published from them keep their part until freed).
func (r *Runtime) releaseDevice() {
	v, ok := devStates.LoadAndDelete(r)
	if !ok {
		return
	}
	st := v.(*deviceState)
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, a := range st.allocs {
		a.shared.Release()
	}
	clear(st.allocs)
}

// deviceMemory is the runtime's memory of d: the CUDA (DLCUDA) or HIP
// (DLROCM) memory whose driver ordinal is d.Index.
func (r *Runtime) deviceMemory(d Device) (*cuda.Memory, error) {
	var api string
	switch d.Type {
	case DLCUDA:
		api = "cuda"
	case DLROCM:
		api = "hip"
	default:
		return nil, invalid("device %v: want a CUDA (2) or ROCm (10) device type", d)
	}
	var kinds []string
	for _, id := range r.rt.Devices() {
		m, err := r.rt.Memory(id)
		if err != nil {
			continue
		}
		if cm, ok := m.(*cuda.Memory); ok {
			if cm.Driver().API().Name == api && cm.Info().Ordinal == d.Index {
				return cm, nil
			}
		}
		if !id.IsHost() {
			kinds = append(kinds, id.String()+"="+m.Stats().Backend)
		}
	}
	return nil, fmt.Errorf("%w: %v: this runtime has no %s device of ordinal %d (its devices: %v; a preset host's GPUs are simulated unless TENSORLANE_DEVICE_BACKEND=%s)",
		rdt.ErrUnknownDevice, d, api, d.Index, kinds, api)
}

// DeviceAlloc allocates n bytes of shareable device memory on d and
// returns its device address; a Put of memory inside it is published
// without a copy (other processes on the host import its handle). Give it
// back with DeviceFree.
func (r *Runtime) DeviceAlloc(ctx context.Context, d Device, n int64) (uint64, error) {
	if n <= 0 {
		return 0, invalid("device allocation of %d bytes", n)
	}
	m, err := r.deviceMemory(d)
	if err != nil {
		return 0, err
	}
	buf, err := m.Alloc(ctx, n)
	if err != nil {
		return 0, err
	}
	a := &devAllocation{shared: tensor.NewShared(buf), mem: m, base: buf.(*cuda.Buffer).Ptr(), n: n}
	st := r.devState()
	st.mu.Lock()
	st.allocs[a.base] = a
	st.mu.Unlock()
	return a.base, nil
}

// DeviceFree gives back memory from DeviceAlloc. Objects published from it
// keep their part until they are freed.
func (r *Runtime) DeviceFree(ptr uint64) error {
	st := r.devState()
	st.mu.Lock()
	a, ok := st.allocs[ptr]
	delete(st.allocs, ptr)
	st.mu.Unlock()
	if !ok {
		return invalid("device address %#x is not the start of device memory this runtime allocated", ptr)
	}
	return a.shared.Release()
}

// owningDevice returns the allocation of m that holds [ptr, ptr+n).
func (r *Runtime) owningDevice(m *cuda.Memory, ptr uint64, n int64) *devAllocation {
	st := r.devState()
	st.mu.Lock()
	defer st.mu.Unlock()
	for _, a := range st.allocs {
		if a.mem == m && ptr >= a.base && ptr-a.base+uint64(n) <= uint64(a.n) {
			return a
		}
	}
	return nil
}

// DeviceRegion is a tensor in device memory: Ptr is its first byte.
type DeviceRegion struct {
	Device  Device
	Ptr     uint64
	DType   string
	Shape   []int64
	Strides []int64
}

// PutDevice publishes a tensor in device memory and returns its marshalled
// Ref. Inside memory from DeviceAlloc it is published in place; memory
// another library allocated (a torch tensor) is first copied on the device
// into a shareable allocation (one device-to-device copy, no host), which
// the object owns: the caller may reuse its memory as soon as PutDevice
// returns.
func (r *Runtime) PutDevice(ctx context.Context, g DeviceRegion) ([]byte, error) {
	d, err := Region{DType: g.DType, Shape: g.Shape, Strides: g.Strides, Mem: nil}.descOnly()
	if err != nil {
		return nil, err
	}
	_, end := d.Span()
	if end <= 0 || g.Ptr == 0 {
		return nil, invalid("empty device region at %#x: nothing to publish", g.Ptr)
	}
	m, err := r.deviceMemory(g.Device)
	if err != nil {
		return nil, err
	}
	var buf tensor.Buffer
	foreign := false
	if a := r.owningDevice(m, g.Ptr, end); a != nil {
		if buf, err = a.shared.Window(int64(g.Ptr-a.base), end); err != nil {
			return nil, err
		}
	} else {
		src, err := m.Wrap(g.Ptr, end)
		if err != nil {
			return nil, invalid("%v", err)
		}
		defer src.Release()
		if buf, err = m.Alloc(ctx, end); err != nil {
			return nil, err
		}
		if err := tensor.Copy(ctx, buf, 0, src, 0, end); err != nil {
			buf.Release()
			return nil, err
		}
		foreign = true
	}
	_, p, err := r.publish(ctx, buf, d, nil, foreign)
	if err != nil {
		return nil, err
	}
	return p, nil
}

// descOnly checks a region's layout without memory to hold it.
func (g Region) descOnly() (tensor.Desc, error) {
	dt, err := tensor.ParseDType(g.DType)
	if err != nil {
		return tensor.Desc{}, invalid("unsupported dtype %q", g.DType)
	}
	d := tensor.Desc{DType: dt, Shape: g.Shape, Strides: g.Strides}
	if d.Strides == nil {
		d.Strides = tensor.ContiguousStrides(g.Shape)
	}
	return d, d.Validate()
}

// GetDevice reads the ref's tensor into n bytes of device memory at ptr on
// d (the caller's: a torch tensor's, or DeviceAlloc's), which must hold its
// span. op, when not 0, names the Get for Cancel.
func (r *Runtime) GetDevice(ctx context.Context, refBytes []byte, d Device, ptr uint64, n int64, op uint64, timeout time.Duration) (rdt.Transfer, error) {
	ref, span, err := refFor(refBytes, n)
	if err != nil {
		return rdt.Transfer{}, err
	}
	m, err := r.deviceMemory(d)
	if err != nil {
		return rdt.Transfer{}, err
	}
	dst, err := m.Wrap(ptr, span)
	if err != nil {
		return rdt.Transfer{}, invalid("%v", err)
	}
	defer dst.Release()
	return r.getInto(ctx, ref, dst, span, op, timeout)
}

// DeviceCopy copies n bytes from src to dst, each a host pointer (DLCPU)
// or device memory of this runtime (tensorlane.copy): host to device and
// back through the device's pinned staging, device to device on the device.
// A pointer is a C pointer either way: a host address, or a device address
// (a CUdeviceptr / hipDeviceptr_t, never dereferenced here).
func (r *Runtime) DeviceCopy(ctx context.Context, dst Device, dstPtr unsafe.Pointer, src Device, srcPtr unsafe.Pointer, n int64) error {
	if n <= 0 {
		return invalid("copy of %d bytes", n)
	}
	open := func(d Device, p unsafe.Pointer) (tensor.Buffer, error) {
		if p == nil {
			return nil, invalid("NULL pointer on %v", d)
		}
		if d.Type == DLCPU {
			// The caller's host memory, kept alive by the caller for the
			// call (Python holds the array).
			return tensor.NewForeign(unsafe.Slice((*byte)(p), n), tensor.ForeignConfig{}), nil
		}
		m, err := r.deviceMemory(d)
		if err != nil {
			return nil, err
		}
		b, err := m.Wrap(uint64(uintptr(p)), n)
		if err != nil {
			return nil, invalid("%v", err)
		}
		return b, nil
	}
	to, err := open(dst, dstPtr)
	if err != nil {
		return err
	}
	defer to.Release()
	from, err := open(src, srcPtr)
	if err != nil {
		return err
	}
	defer from.Release()
	return tensor.Copy(ctx, to, 0, from, 0, n)
}
